"""TensorBoard event files (issue Q part 1), read back with TensorBoard's own reader (EventAccumulator), never
with basebn's writer: the tags and values written, the precise-BN drift against numpy written from the BN
report's definition, a resumed run's steps appearing once, rank 0 only, and log.tensorboard=False."""
import glob
import os
import shutil

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from basebn import distributed as dist
from basebn.engine.run_record import RunRecord
from basebn.engine.tensorboard_hook import TensorBoardHook, tensorboard_hooks
from basebn.engine.tensorboard_log import EVENT_GLOB, TensorBoardLog, precise_bn_drift
from basebn.layers.norm import is_bn
from basebn.models import build_model
from tests.support.cli import TINY, run, write_config
from tests.support.mpi_launch import run_mpi

# the CLI tests' tiny run (6 iterations per epoch, 2 epochs, a log every 3) with EMA and precise BN every epoch
TB_TINY = TINY.replace("log_every_n_iter=3)", "log_every_n_iter=3, model_ema=dict(enabled=True, momentum=0.5), "
                                              "bn=dict(precise_every_n_epoch=1, num_samples_precise=32))")
ITERS = 6


def read(log_dir):
    """TensorBoard's view of `log_dir`: an EventAccumulator keeping every event (no sampling)."""
    acc = EventAccumulator(log_dir, size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    return acc


def steps(acc, tag):
    return [e.step for e in acc.Scalars(tag)]


def test_precise_bn_drift_matches_the_bn_report_definition():
    """Per layer: mean over channels of |mean_before - mean_after| / sqrt(var_after), and of
    var_before / var_after (the recomputed statistics are the reference)."""
    rng = np.random.default_rng(0)
    before, after, expected = {}, {}, {}
    for name, c in (("stem.bn", 3), ("s1.b1.bn", 5)):
        mb, ma = rng.normal(size=c), rng.normal(size=c)
        vb, va = rng.uniform(0.5, 2, c), rng.uniform(0.5, 2, c)
        before.update({f"{name}.running_mean": mb, f"{name}.running_var": vb})
        after.update({f"{name}.running_mean": ma, f"{name}.running_var": va})
        expected[name] = (sum(abs(mb[i] - ma[i]) / va[i] ** 0.5 for i in range(c)) / c,
                          sum(vb[i] / va[i] for i in range(c)) / c)
    drift = precise_bn_drift(before, after)
    assert sorted(drift) == sorted(expected)
    for name, (shift, ratio) in expected.items():
        assert drift[name] == {"mean_shift": pytest.approx(shift, rel=1e-12), "var_ratio": pytest.approx(ratio, rel=1e-12)}


def test_tags_and_values_read_back(tmp_path):
    log = TensorBoardLog(str(tmp_path))
    log.iteration(3, loss=2.5, lr=0.1, top1=12.5, data_time=0.01, step_time=0.2, images_per_s=80.0)
    log.evaluation(6, {"epoch": 1, "top1": 40.0, "top5": 90.0, "loss": 1.5, "images": 37, "ema_top1": 41.0,
                       "ema_top5": 91.0, "ema_loss": 1.4})
    log.bn_drift(6, {"stem.bn": {"mean_shift": 0.25, "var_ratio": 1.5}, "s1.bn": {"mean_shift": 0.75, "var_ratio": 0.5}})
    log.close()
    acc = read(str(tmp_path))
    values = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    assert values == {
        "train/loss": [(3, 2.5)], "train/lr": [(3, pytest.approx(0.1))], "train/top1": [(3, 12.5)],
        "time/data_s": [(3, pytest.approx(0.01))], "time/step_s": [(3, pytest.approx(0.2))],
        "time/images_per_s": [(3, 80.0)],
        "eval/top1": [(6, 40.0)], "eval/top5": [(6, 90.0)], "eval/loss": [(6, 1.5)],
        "eval_ema/top1": [(6, 41.0)], "eval_ema/top5": [(6, 91.0)], "eval_ema/loss": [(6, pytest.approx(1.4))],
        "bn_drift/stem.bn/mean_shift": [(6, 0.25)], "bn_drift/stem.bn/var_ratio": [(6, 1.5)],
        "bn_drift/s1.bn/mean_shift": [(6, 0.75)], "bn_drift/s1.bn/var_ratio": [(6, 0.5)]}
    hist = acc.Histograms("bn_drift/mean_shift")
    assert len(hist) == 1 and hist[0].step == 6
    assert (hist[0].histogram_value.num, hist[0].histogram_value.min, hist[0].histogram_value.max) == (2, 0.25, 0.75)


def test_an_infinite_drift_is_logged_and_left_out_of_the_histogram(tmp_path):
    """A channel whose recomputed variance is 0 gives an infinite var_ratio: its scalar reads back as inf and
    the histogram over the layers holds the finite value only (binning infinite values raised before)."""
    log = TensorBoardLog(str(tmp_path))
    log.bn_drift(6, {"a.bn": {"mean_shift": 0.25, "var_ratio": float("inf")},
                     "b.bn": {"mean_shift": 0.5, "var_ratio": 2.0}})
    log.close()
    acc = read(str(tmp_path))
    assert [e.value for e in acc.Scalars("bn_drift/a.bn/var_ratio")] == [float("inf")]
    hist = acc.Histograms("bn_drift/var_ratio")[0].histogram_value
    assert (hist.num, hist.min, hist.max) == (1, 2.0, 2.0)


def test_a_later_writer_supersedes_the_steps_from_its_first_step(tmp_path):
    """A killed writer logged steps 1-10 (and an evaluation at 10); the resumed one starts at 6 in the same
    second (file names then differ only by the sequence suffix): steps 6-10 appear once, with its values.
    Its flush() is a barrier: the evaluation logged just before it is in the file (tensorboardX's SummaryWriter
    returned from flush() with events still queued, and this test passed or failed by chance)."""
    killed = TensorBoardLog(str(tmp_path))
    for step in range(1, 11):
        killed.iteration(step, loss=step, lr=0.1, top1=0, data_time=0, step_time=0.1, images_per_s=1)
    killed.evaluation(10, {"top1": 1.0, "top5": 2.0, "loss": 3.0})
    killed.flush()  # never closed: killed
    resumed = TensorBoardLog(str(tmp_path), first_step=6)
    for step in range(6, 13):
        resumed.iteration(step, loss=100 + step, lr=0.1, top1=0, data_time=0, step_time=0.1, images_per_s=1)
    resumed.close()
    acc = read(str(tmp_path))
    assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == \
        [(s, s) for s in range(1, 6)] + [(s, 100 + s) for s in range(6, 13)]
    # the killed run's evaluation at step 10 reached the file (flush) and is superseded: TensorBoard keeps the
    # tag, with no points
    assert acc.Scalars("eval/top1") == []
    assert len(glob.glob(str(tmp_path / EVENT_GLOB))) == 2


def test_a_run_writes_every_curve_and_a_resume_logs_each_step_once(tmp_path):
    """A tiny CLI run (EMA, precise BN every epoch) writes the training, evaluation and drift curves. Then the
    run is set back to its epoch-1 checkpoint, as a kill during epoch 2's checkpoint leaves it (epoch 2 logged,
    latest.npz still epoch 1), and resumed: epoch 2's steps are logged again and TensorBoard shows each once."""
    cfg = write_config(tmp_path, TB_TINY)
    run_dir = str(tmp_path / "run")
    r = run(["basebn.train", cfg, f"output_dir={run_dir}"])
    assert r.returncode == 0, r.stderr
    first = read(run_dir)
    logged = [3, 6, 9, 12]  # every 3 iterations, 6 per epoch
    assert {t: steps(first, t) for t in ("train/loss", "time/images_per_s", "eval/top1", "eval_ema/top5")} == \
        {"train/loss": logged, "time/images_per_s": logged, "eval/top1": [6, 12], "eval_ema/top5": [6, 12]}
    drift = [t for t in first.Tags()["scalars"] if t.startswith("bn_drift/") and t.endswith("/mean_shift")]
    bn_layers = [n for n, m in build_model("resnet20", num_classes=10, base_width=4).named_modules() if is_bn(m)]
    assert sorted(drift) == sorted(f"bn_drift/{n}/mean_shift" for n in bn_layers)
    assert all(steps(first, t) == [6, 12] for t in drift)
    assert any(t.startswith("bn_drift_ema/") for t in first.Tags()["scalars"])
    # as a kill during epoch 2's checkpoint leaves the run: latest.npz still epoch 1's, no final.npz
    shutil.copy(os.path.join(run_dir, "epoch_1.npz"), os.path.join(run_dir, "latest.npz"))
    os.remove(os.path.join(run_dir, "final.npz"))
    old_files = glob.glob(os.path.join(run_dir, EVENT_GLOB))
    r = run(["basebn.train", cfg, f"output_dir={run_dir}", "--resume"])
    assert r.returncode == 0, r.stderr
    new_file = (set(glob.glob(os.path.join(run_dir, EVENT_GLOB))) - set(old_files)).pop()
    resumed_from = read(new_file).FirstEventTimestamp()  # the resumed writer's first event (its START)
    acc = read(run_dir)
    for tag in acc.Tags()["scalars"]:
        assert len(steps(acc, tag)) == len(set(steps(acc, tag))), tag  # each step once
    assert steps(acc, "train/loss") == logged and steps(acc, "eval/top1") == [6, 12]
    late = [e for e in acc.Scalars("train/loss") if e.step > ITERS]
    assert late and all(e.wall_time >= resumed_from for e in late)  # epoch 2 as the resumed run logged it


def test_log_tensorboard_false_writes_no_event_file(tmp_path):
    cfg = write_config(tmp_path, TINY.replace("max_epoch=2", "max_epoch=1"))
    run_dir = str(tmp_path / "run")
    r = run(["basebn.train", cfg, f"output_dir={run_dir}", "log.tensorboard=False"])
    assert r.returncode == 0, r.stderr
    assert os.path.isfile(os.path.join(run_dir, "final.npz"))
    assert glob.glob(os.path.join(run_dir, EVENT_GLOB)) == []


def test_ranks_other_than_0_get_no_tensorboard_hook(monkeypatch, tmp_path):
    assert [type(h) for h in tensorboard_hooks(str(tmp_path), 3, RunRecord())] == [TensorBoardHook]
    monkeypatch.setattr(dist, "is_main_process", lambda: False)
    assert tensorboard_hooks(str(tmp_path), 3, RunRecord(), precise_bn=True) == []


@pytest.mark.mpi
def test_two_ranks_write_one_event_file(tmp_path):
    cfg = write_config(tmp_path, TINY.replace("max_epoch=2", "max_epoch=1"))
    run_dir = str(tmp_path / "run")
    run_mpi(2, "-m", "basebn.train", cfg, f"output_dir={run_dir}", timeout=400)
    files = glob.glob(os.path.join(run_dir, EVENT_GLOB))
    assert len(files) == 1
    assert len(steps(read(run_dir), "eval/top1")) == 1
