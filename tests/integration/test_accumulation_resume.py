"""Kill + --resume with gradient accumulation that does not divide the epoch (4 over the tiny config's 6
iterations): the resumed run ends with the files and metrics of the uninterrupted one, bit for bit, since an
optimizer step never spans an epoch and so a checkpoint holds no partial accumulation."""
from tests.integration.test_train_cli import assert_same_run, run_killed
from tests.support.cli import TINY, run, write_config

ACCUM = ["solver.accumulation_steps=4"]  # train_size 96 / batch_size 16 = 6 iterations per epoch


def test_resume_with_partial_accumulation_gives_the_uninterrupted_run(tmp_path):
    tiny = write_config(tmp_path, TINY)
    full, killed = str(tmp_path / "full"), str(tmp_path / "killed")
    r = run(["basebn.train", tiny, f"output_dir={full}", *ACCUM])
    assert r.returncode == 0, r.stderr
    r = run_killed(tiny, killed, 3, *ACCUM)  # writes: best, epoch_1, latest of epoch 1, then killed
    assert r.returncode == 137, r.stderr
    r = run(["basebn.train", tiny, f"output_dir={killed}", *ACCUM, "--resume"])
    assert r.returncode == 0, r.stderr
    assert "resumed from" in r.stderr and "after epoch 1" in r.stderr
    assert_same_run(full, killed)
