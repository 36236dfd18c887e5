"""The CLIs end to end on a tiny config: train, test, resume after SIGKILL, NaN stop, clear user errors."""
import json
import os
import pickle
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest

from basebn.checkpoint import load_checkpoint
from tests.support import ROOT
from tests.support.cli import PY, TINY, metrics, run, train_one_epoch
from tests.support.cli_batch import run_mains

# the reference run's config: TINY with 3 training iterations an epoch, not 6 (the kill test starts 2 processes per
# checkpoint write of it); its epoch 2 still improves on epoch 1, so best.npz is written at both epochs
REFERENCE = TINY.replace("train_size=96", "train_size=48")
assert REFERENCE != TINY


@pytest.fixture(scope="module")
def one_epoch(tmp_path_factory):
    """(tiny config path, run directory) of `python -m basebn.train TINY solver.max_epoch=1`, for the tests that
    read such a run, or copy it to change it."""
    return train_one_epoch(tmp_path_factory.mktemp("one_epoch"))[:2]


def test_train_then_test_end_to_end(reference):
    tiny, run_dir, _ = reference  # `python -m basebn.train`'s main(argv), run uninterrupted
    rows = metrics(run_dir)
    assert [m["epoch"] for m in rows] == [1, 2]
    assert all(m["images"] == 37 and 0 <= m["top1"] <= m["top5"] <= 100 for m in rows)
    for name in ("latest.npz", "final.npz", "best.npz", "epoch_1.npz", "config.json", "config_diff.json", "log.txt"):
        assert os.path.isfile(os.path.join(run_dir, name)), name
    assert json.load(open(os.path.join(run_dir, "config_diff.json")))["solver.max_epoch"] == 2
    r = run(["basebn.test", tiny, "-w", run_dir, "--json"])
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["images"] == 37
    assert result["top1"] == pytest.approx(rows[-1]["top1"])


def test_resume_after_sigkill_matches_uninterrupted(reference, tmp_path):
    tiny, full, _ = reference
    killed = str(tmp_path / "killed")
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.Popen([PY, "-m", "basebn.train", tiny, f"output_dir={killed}"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    latest = os.path.join(killed, "latest.npz")
    deadline = time.time() + 300
    while not os.path.exists(latest) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL  # killed in epoch 2, not ended by itself
    r = run(["basebn.train", tiny, f"output_dir={killed}", "--resume"])
    assert r.returncode == 0, r.stderr
    a, b = metrics(full), metrics(killed)
    assert [m["epoch"] for m in b] == [1, 2]  # no epoch counted twice
    assert a[-1] == b[-1]  # identical final metrics (CPU is deterministic here)


def test_a_diverged_run_stops_and_keeps_last_checkpoint(one_epoch, tmp_path):
    tiny, run_dir = one_epoch[0], str(tmp_path / "run")
    shutil.copytree(one_epoch[1], run_dir)
    before = open(os.path.join(run_dir, "latest.npz"), "rb").read()
    r = run(["basebn.train", tiny, f"output_dir={run_dir}", "solver.max_epoch=3", "solver.basic_lr=1e30",
             "solver.warmup_epochs=0", "--resume", "--allow-config-change"])
    assert r.returncode == 1
    # the first step at lr 1e30 leaves finite weights whose loss is finite and gradients are not: the skipped steps
    # stop the run (a NaN loss would stop it at the loss check)
    assert "5 optimizer steps in a row skipped (non-finite gradients), the last at epoch 2 iteration 6" in r.stderr
    assert f"The last checkpoint {os.path.join(run_dir, 'latest.npz')} is intact" in r.stderr
    assert open(os.path.join(run_dir, "latest.npz"), "rb").read() == before


def test_user_errors_are_one_line(tiny, tmp_path):
    typo, missing, classes, no_data = run_mains([  # each ends before training: one process for the four
        ("basebn.train", [tiny, "solver.max_epochs=3"]),
        ("basebn.train", [str(tmp_path / "missing.py")]),
        ("basebn.train", [tiny, "num_classes=3", f"output_dir={tmp_path / 'run'}"]),
        ("basebn.train", [tiny, "data.name=fashion_mnist", f"data.root={tmp_path}", f"output_dir={tmp_path / 'run'}"]),
    ])
    for r, words in ((typo, "did you mean 'solver.max_epoch'"), (missing, "does not exist"), (classes, "num_classes"),
                     (no_data, str(tmp_path))):
        assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr, (words, r.stderr)


def test_test_cli_rejects_other_architecture_and_corrupt_file(one_epoch, tmp_path):
    tiny, run_dir = one_epoch
    bad = tmp_path / "bad.npz"
    bad.write_bytes(open(os.path.join(run_dir, "final.npz"), "rb").read()[:100])
    other, corrupt = run_mains([("basebn.test", [tiny, "-w", run_dir, "model.name=resnet32"]),
                                ("basebn.test", [tiny, "-w", str(bad)])])
    assert other.returncode == 2 and "Traceback" not in other.stderr  # the checkpoint's config says why, in one line
    assert "was trained with model.name='resnet20' (the config gives 'resnet32')" in other.stderr.splitlines()[-1]
    assert corrupt.returncode == 2 and "truncated or corrupt" in corrupt.stderr and "Traceback" not in corrupt.stderr


def test_zoo_export_then_evaluate_and_finetune_from_entry(one_epoch, tmp_path):
    run_dir, zoo_dir = str(tmp_path / "run"), tmp_path / "zoo"
    zoo_dir.mkdir()
    tiny = shutil.copy(one_epoch[0], zoo_dir / "tiny.py")  # an entry's config lives in its zoo folder
    env = {"BASEBN_ZOO": str(zoo_dir)}
    shutil.copytree(one_epoch[1], run_dir)  # trained by this config's text, solver.max_epoch=1
    r = run(["basebn.tools.zoo_export", run_dir, "tiny_r20", "--config", tiny, "--command", "test"],
            env=dict(os.environ, PYTHONPATH=ROOT, **env))
    assert r.returncode == 0, r.stderr
    entry = json.loads(r.stdout.strip().splitlines()[-1])
    index = json.load(open(zoo_dir / "zoo.json"))
    assert index["entries"][0]["sha256"] == entry["sha256"] and "tiny_r20" in open(zoo_dir / "README.md").read()
    # the training command given, then the export's own invocation (runnable as recorded: --config included)
    assert entry["command"] == f"test; python -m basebn.tools.zoo_export {run_dir} tiny_r20 --config {tiny}"
    r = run(["basebn.test", "zoo:tiny_r20", "--json"], env=dict(os.environ, PYTHONPATH=ROOT, **env))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["top1"] == pytest.approx(entry["top1"], abs=0.05)
    r = run(["basebn.train", tiny, f"output_dir={tmp_path / 'ft'}", "solver.max_epoch=1", "model.weights=zoo:tiny_r20",
             "bn.norm_eval=True", "data.train_size=16"], env=dict(os.environ, PYTHONPATH=ROOT, **env))  # 1 step
    assert r.returncode == 0, r.stderr
    assert "loaded weights from zoo:tiny_r20" in r.stderr
    with open(zoo_dir / "tiny_r20.npz", "ab") as f:  # a damaged file is refused
        f.write(b"x")
    r = run(["basebn.test", "zoo:tiny_r20"], env=dict(os.environ, PYTHONPATH=ROOT, **env))
    assert r.returncode == 2 and "sha256" in r.stderr and "Traceback" not in r.stderr


def test_trace_flag_trains_like_eager(one_epoch, tmp_path):
    (tiny, eager), traced = one_epoch, str(tmp_path / "traced")
    r = run(["basebn.train", tiny, f"output_dir={traced}", "solver.max_epoch=1", "trace=True"])
    assert r.returncode == 0, r.stderr
    assert metrics(traced)[-1]["loss"] == pytest.approx(metrics(eager)[-1]["loss"], rel=1e-3)


# -- recoverable epoch ends: every kill point, legacy runs, damaged files ---------------------------------------

KILL_DRIVER = """
import os, sys
sys.path.insert(0, sys.argv[1])
import basebn.checkpoint.format as fmt
import basebn.train
kill_at, done, real = int(sys.argv[2]), [0], fmt.atomic_write_bytes
def write(path, data):  # the checkpoint writer, killed (no clean-up at all) before its write number kill_at
    if done[0] == kill_at:
        os._exit(137)
    real(path, data)
    done[0] += 1
fmt.atomic_write_bytes = write
code = basebn.train.main(sys.argv[3:])
print(f"checkpoint writes: {done[0]}")
sys.exit(code)
"""
CKPTS = ("final.npz", "best.npz", "latest.npz", "epoch_1.npz", "epoch_2.npz")


def run_killed(tiny, run_dir, kill_at, *args):
    return subprocess.run([PY, "-c", KILL_DRIVER, ROOT, str(kill_at), tiny, f"output_dir={run_dir}", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)


def content(path):
    """Every array of a checkpoint and its metadata but the config (which names the run directory)."""
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files if k not in ("__meta__", "__sha256__")}
        meta = json.loads(z["__meta__"].tobytes())
    meta.pop("config", None)
    return arrays, meta


def assert_same_run(reference, other, names=CKPTS):
    assert metrics(other) == metrics(reference)
    for name in names:
        a, meta_a = content(os.path.join(reference, name))
        b, meta_b = content(os.path.join(other, name))
        assert meta_b == meta_a, name
        assert sorted(b) == sorted(a), name
        for k in a:
            np.testing.assert_array_equal(b[k], a[k], err_msg=f"{name}: {k}")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """(config path, run directory, checkpoint writes) of an uninterrupted 2-epoch run of REFERENCE."""
    folder = tmp_path_factory.mktemp("reference")
    tiny = folder / "tiny.py"
    tiny.write_text(REFERENCE)
    run_dir = str(folder / "run")
    r = run_killed(str(tiny), run_dir, -1)
    assert r.returncode == 0, r.stderr
    writes = int(r.stdout.split("checkpoint writes: ")[1].split()[0])
    assert writes >= 6  # best, epoch_1, latest; (best), epoch_2, latest; final
    assert content(os.path.join(run_dir, "latest.npz"))[1]["best_epoch"] == 2  # so (best) is a write to kill at
    return str(tiny), run_dir, writes


def test_kill_at_every_checkpoint_write_then_resume_gives_the_uninterrupted_run(reference, tmp_path):
    tiny, ref_dir, writes = reference
    for k in range(writes):
        run_dir = str(tmp_path / f"killed_{k}")
        r = run_killed(tiny, run_dir, k)
        assert r.returncode == 137, (k, r.stderr)
        r = run(["basebn.train", tiny, f"output_dir={run_dir}", "--resume"])
        assert r.returncode == 0, (k, r.stderr)
        assert_same_run(ref_dir, run_dir)
        if k == writes - 1:  # killed before final.npz, after the last latest.npz
            assert "--resume completed what the stopped run left missing: final.npz (epoch 2)" in r.stderr
        if k < 3:  # killed after the first evaluation, before the first latest.npz
            assert "starting from epoch 1" in r.stderr


def test_resume_repairs_best_left_stale_by_the_old_write_order(reference, tmp_path):
    _, ref_dir, _ = reference
    tiny = reference[0]
    run_dir = str(tmp_path / "run")
    shutil.copytree(ref_dir, run_dir)
    best_epoch = content(os.path.join(ref_dir, "latest.npz"))[1]["best_epoch"]
    shutil.copy(os.path.join(run_dir, f"epoch_{3 - best_epoch}.npz"), os.path.join(run_dir, "best.npz"))
    os.remove(os.path.join(run_dir, "final.npz"))
    r = run(["basebn.train", tiny, f"output_dir={run_dir}", "--resume"])
    assert r.returncode == 0, r.stderr
    assert f"best.npz (epoch {best_epoch}); final.npz (epoch 2)" in r.stderr
    assert_same_run(ref_dir, run_dir)


def test_partial_metrics_line_does_not_stop_resume(reference, tmp_path):
    tiny, ref_dir, _ = reference
    run_dir = str(tmp_path / "run")
    shutil.copytree(ref_dir, run_dir)
    os.remove(os.path.join(run_dir, "final.npz"))
    with open(os.path.join(run_dir, "metrics.jsonl"), "a") as f:
        f.write('{"epoch": 3, "top1": 1')  # a crash (or a full disk) in the middle of a line
    r = run(["basebn.train", tiny, f"output_dir={run_dir}", "--resume"])
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "dropped a partial or corrupt line" in r.stderr
    assert_same_run(ref_dir, run_dir)


def test_resume_of_a_legacy_pkl_run(reference, tmp_path):
    """A run directory of an older basebn holds only latest.pkl (pickled, format v1); it resumes and ends as the
    uninterrupted run does."""
    tiny, ref_dir, _ = reference
    run_dir = str(tmp_path / "legacy")
    shutil.copytree(ref_dir, run_dir)
    ckpt = load_checkpoint(os.path.join(run_dir, "epoch_1.npz"))
    legacy = {"format": "basebn-checkpoint-v1", **{k: ckpt[k] for k in (
        "model", "ema", "optimizer", "scaler", "epoch", "best_top1", "rng", "config")}}
    with open(os.path.join(run_dir, "latest.pkl"), "wb") as f:
        pickle.dump(legacy, f, protocol=4)
    for name in os.listdir(run_dir):
        if name.endswith(".npz"):
            os.remove(os.path.join(run_dir, name))
    r = run(["basebn.train", tiny, f"output_dir={run_dir}", "--resume"])
    assert r.returncode == 0, r.stderr
    assert "resumed from" in r.stderr and "latest.pkl after epoch 1" in r.stderr
    assert_same_run(ref_dir, run_dir, names=("final.npz", "latest.npz", "epoch_2.npz"))


def test_resume_from_damaged_or_final_latest_fails_clearly(reference, tmp_path):
    tiny, ref_dir, _ = reference
    run_dir = str(tmp_path / "run")
    shutil.copytree(ref_dir, run_dir)
    latest = os.path.join(run_dir, "latest.npz")
    data = open(latest, "rb").read()
    open(latest, "wb").write(data[: len(data) // 2])
    r = run(["basebn.train", tiny, f"output_dir={run_dir}", "--resume"])
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "truncated or corrupt" in r.stderr and "epoch_2.npz, epoch_1.npz" in r.stderr
    shutil.copy(os.path.join(run_dir, "final.npz"), latest)  # weights only: no optimizer state
    r = run(["basebn.train", tiny, f"output_dir={run_dir}", "--resume"])
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "no optimizer/progress state" in r.stderr


class _CreatesFile:
    """Unpickling this calls open(target, "w"): the payload of a malicious checkpoint."""

    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return open, (self.target, "w")


def test_weights_that_would_run_code_are_refused(reference, tmp_path):
    tiny = reference[0]
    target = tmp_path / "created_by_pickle"
    evil = tmp_path / "evil.pkl"
    evil.write_bytes(pickle.dumps({"format": "basebn-checkpoint-v1", "model": _CreatesFile(str(target))}, protocol=4))
    r = run(["basebn.test", tiny, "-w", str(evil)])
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "refused to load global io.open" in r.stderr and str(evil) in r.stderr
    assert not target.exists()


def test_export_refuses_a_malformed_zoo_index_and_leaves_it(reference, tmp_path):
    tiny, ref_dir, _ = reference
    (tmp_path / "zoo.json").write_text('{"entries": [')
    r = run(["basebn.tools.zoo_export", ref_dir, "x", "--config", tiny],
            env=dict(os.environ, PYTHONPATH=ROOT, BASEBN_ZOO=str(tmp_path)))
    assert r.returncode == 2 and "not valid JSON" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert (tmp_path / "zoo.json").read_text() == '{"entries": ['
    assert sorted(os.listdir(tmp_path)) == ["zoo.json"]


@pytest.mark.parametrize("name", ["mbnetv2_x035", "regnetx_002"])
def test_other_model_families_train_and_evaluate_from_the_cli(tiny, tmp_path, name):
    """model.name takes any family (the tiny config's ResNet-only base_width reset: other families refuse it)."""
    run_dir = str(tmp_path / "run")
    r = run(["basebn.train", tiny, f"model.name={name}", "model.base_width=None", "data.image_size=16",
             "solver.max_epoch=1", "data.train_size=16", f"output_dir={run_dir}"])  # one step
    assert r.returncode == 0, r.stderr[-2000:]
    (row,) = metrics(run_dir)
    assert row["epoch"] == 1 and row["images"] == 37
    r = run(["basebn.test", tiny, f"model.name={name}", "model.base_width=None", "data.image_size=16", "-w", run_dir,
             "--json"])
    assert r.returncode == 0 and json.loads(r.stdout.strip().splitlines()[-1])["top1"] == pytest.approx(row["top1"])


def files_of(run_dir):
    """{name: bytes} of every file in run_dir."""
    return {n: open(os.path.join(run_dir, n), "rb").read() for n in sorted(os.listdir(run_dir))
            if os.path.isfile(os.path.join(run_dir, n))}


def test_resume_with_a_changed_config_says_what_differs_and_needs_the_flag(reference, tmp_path):
    tiny, ref_dir, _ = reference
    run_dir = str(tmp_path / "run")
    shutil.copytree(ref_dir, run_dir)
    before = files_of(run_dir)
    r = run(["basebn.train", tiny, f"output_dir={run_dir}", "batch_size=32", "solver.basic_lr=0.2", "--resume"])
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert "batch_size 16 -> 32" in line and "solver.basic_lr 0.1 -> 0.2" in line and "--allow-config-change" in line
    assert files_of(run_dir) == before  # refused before anything was written, log.txt included
    # what changes nothing the run computes may differ: its directory (a copy), workers, logging
    r = run(["basebn.train", tiny, f"output_dir={run_dir}", "data.num_workers=0", "log_every_n_iter=5", "--resume"])
    assert r.returncode == 0, r.stderr
    r = run(["basebn.train", tiny, f"output_dir={run_dir}", "solver.max_epoch=3", "--resume", "--allow-config-change"])
    assert r.returncode == 0, r.stderr
    assert "continuing with a changed config: solver.max_epoch 2 -> 3" in r.stderr
    assert [row["epoch"] for row in metrics(run_dir)] == [1, 2, 3]
    assert json.load(open(os.path.join(run_dir, "config.json")))["solver"]["max_epoch"] == 3  # recorded
    r = run(["basebn.train", tiny, f"output_dir={run_dir}", "solver.max_epoch=3", "--resume"])
    assert r.returncode == 0, r.stderr  # the run's config is now the changed one


FOREIGN_METRICS = b"step,loss\n100,0.31\n200,0.27\n"


@pytest.mark.parametrize("with_run", [False, True])
def test_resume_never_rewrites_a_metrics_file_basebn_did_not_write(reference, tmp_path, with_run):
    tiny, ref_dir, _ = reference
    run_dir = str(tmp_path / "run")
    if with_run:
        shutil.copytree(ref_dir, run_dir)
    else:
        os.makedirs(run_dir)  # only the user's own file: the old code truncated it and trained
    with open(os.path.join(run_dir, "metrics.jsonl"), "wb") as f:
        f.write(FOREIGN_METRICS)
    before = files_of(run_dir)
    r = run(["basebn.train", tiny, f"output_dir={run_dir}", "--resume"])
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert "metrics.jsonl was not written by basebn (line 1: 'step,loss'" in line and "output_dir" in line
    assert files_of(run_dir) == before


def test_resume_never_overwrites_a_config_json_basebn_did_not_write(tiny, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text('{"name": "my-app", "port": 8080}\n')
    r = run(["basebn.train", tiny, f"output_dir={run_dir}", "--resume"])
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "config.json is not a config basebn wrote" in r.stderr
    assert (run_dir / "config.json").read_text() == '{"name": "my-app", "port": 8080}\n'
    assert sorted(os.listdir(run_dir)) == ["config.json"]
