"""python -m basebn.test --adapt end to end: a tiny model trained on synthetic shapes, evaluated on test images
shifted by a changed normalisation (offset and contrast), where every adaptation must beat none."""
import json
import os

import numpy as np
import pytest

from basebn.checkpoint import load_checkpoint
from tests.support.cli import run
from tests.support.cli_batch import run_mains

CONFIG = """
from basebn.config import BaseConfig
class Cfg(BaseConfig):
    def __init__(self):
        super().__init__()
        self.merge(dict(batch_size=32, seed=3,
            data=dict(name="synthetic", image_size=12, train_size=1000, test_size=200, pad=1, prefetch=False),
            model=dict(name="resnet20", base_width=8), model_ema=dict(enabled=True),
            solver=dict(max_epoch=2, warmup_epochs=1, basic_lr=0.4), log_every_n_iter=100))
"""
# the training normalisation is mean 74.2, std 68.3: these test images are brighter and of higher contrast
SHIFT = ["data.mean=[10]", "data.std=[30]"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("adapt")
    cfg = root / "cfg.py"
    cfg.write_text(CONFIG)
    run_dir = str(root / "run")
    r = run(["basebn.train", str(cfg), f"output_dir={run_dir}"])
    assert r.returncode == 0, r.stderr
    return str(cfg), run_dir, root


def _tests(cfg, *calls):
    """(the JSON result, stderr) of `basebn.test cfg -w WEIGHTS SHIFT --json ARGS` for each (WEIGHTS, *ARGS) of
    calls, all in one process (tests/support/cli_batch.py)."""
    results = run_mains([("basebn.test", [cfg, "-w", weights, *SHIFT, "--json", *args]) for weights, *args in calls])
    for r in results:
        assert r.returncode == 0, r.stderr
    return [(json.loads(r.stdout.strip().splitlines()[-1]), r.stderr) for r in results]


def _test(cfg, run_dir, *args):
    (result,) = _tests(cfg, (run_dir, *args))
    return result


def test_every_adaptation_beats_none_under_a_shift(trained):
    cfg, run_dir, _ = trained
    methods = ("bn_batch", "adabn", "tent")
    (none, _), *adapted = _tests(cfg, (run_dir,), *[(run_dir, "--adapt", method) for method in methods])
    for method, (result, log) in zip(methods, adapted):
        assert result["images"] == 200
        assert result["top1"] > none["top1"], (method, result, none)
        assert result["loss"] < none["loss"], (method, result, none)
        assert "evaluation batch size 32" in log


def test_save_adapted_writes_weights_that_reproduce_adabn(trained, tmp_path):
    cfg, run_dir, _ = trained
    out = str(tmp_path / "adapted.npz")
    (adapted, _), (plain, _) = _tests(cfg, (run_dir, "--adapt", "adabn", "--save-adapted", out), (out,))
    payload = load_checkpoint(out)
    source = load_checkpoint(os.path.join(run_dir, "final.npz"))["model"]
    assert set(payload["model"]) == set(source)
    np.testing.assert_array_equal(payload["model"]["conv1.weight"], source["conv1.weight"])  # weights kept
    assert not np.allclose(payload["model"]["bn1.running_mean"], source["bn1.running_mean"])  # statistics new
    assert plain["top1"] == adapted["top1"] and plain["loss"] == pytest.approx(adapted["loss"], rel=1e-5)
    before = open(out, "rb").read()
    r = run(["basebn.test", cfg, "-w", run_dir, *SHIFT, "--adapt", "tent", "--save-adapted", out])
    assert r.returncode == 2 and "exists" in r.stderr and "--force" in r.stderr and "Traceback" not in r.stderr
    assert open(out, "rb").read() == before
    _test(cfg, run_dir, "--adapt", "tent", "--save-adapted", out, "--force")
    assert open(out, "rb").read() != before


def test_ema_weights_adapt_and_episodic_tent_runs(trained):
    cfg, run_dir, _ = trained
    (result, _), episodic = _tests(cfg, (run_dir, "--ema", "--adapt", "bn_batch"),
                                   (run_dir, "--adapt", "tent", "--episodic", "--adapt-steps", "2",
                                    "--adapt-optimizer", "sgd", "--adapt-lr", "0.01"))
    assert result["images"] == 200
    result, log = episodic
    assert result["images"] == 200 and "sgd lr 0.01, 2 step(s) per batch, episodic" in log


BAD_OPTIONS = [
    (["--adapt", "tent", "--backend", "onnxruntime"], "--backend onnxruntime"),
    (["--adapt", "bn_batch", "--backend", "lite"], "--backend lite"),
    (["--adapt", "adabn", "-w", "model.mge"], "exported model"),
    (["--episodic"], "--adapt tent only"),
    (["--adapt", "tent", "--adapt-steps", "0"], "--adapt-steps"),
    (["--save-adapted", "x.npz"], "needs an adaptation method"),
]


@pytest.fixture(scope="module")
def bad_options(tmp_path_factory):
    """{tuple(ARGS): the result of `basebn.test CONFIG -w MISSING ARGS`} for the ARGS of BAD_OPTIONS, all in one
    process (each ends at its start: tests/support/cli_batch.py)."""
    folder = tmp_path_factory.mktemp("bad_options")
    cfg = folder / "cfg.py"
    cfg.write_text(CONFIG)
    results = run_mains([("basebn.test", [str(cfg), "-w", str(folder / "missing"), *args]) for args, _ in BAD_OPTIONS])
    return {tuple(args): r for (args, _), r in zip(BAD_OPTIONS, results)}


@pytest.mark.parametrize("args, words", BAD_OPTIONS)
def test_bad_adapt_options_are_one_line(bad_options, args, words):
    r = bad_options[tuple(args)]
    assert r.returncode == 2, r.stderr
    assert words in r.stderr and "Traceback" not in r.stderr
    assert len([line for line in r.stderr.splitlines() if line.startswith("error:")]) == 1


@pytest.mark.mpi
def test_adabn_over_three_ranks_equals_one_process(tiny, tmp_path):
    from basebn.checkpoint import model_state, save_npz_weights
    from basebn.config import load_config
    from basebn.engine.build import build_model_from_cfg
    from tests.support.mpi_launch import run_mpi

    cfg_path = tmp_path / "sync.py"
    cfg_path.write_text(open(tiny).read().replace('base_width=4)', 'base_width=4, norm="SyncBN")'))
    weights = str(tmp_path / "w.npz")
    save_npz_weights(weights, model_state(build_model_from_cfg(load_config(str(cfg_path)), in_channels=1)))
    multi_out, single_out = str(tmp_path / "multi.npz"), str(tmp_path / "single.npz")
    args = [str(cfg_path), "-w", weights, *SHIFT, "--adapt", "adabn", "--json", "--save-adapted"]
    out = run_mpi(3, "-m", "basebn.test", *args, multi_out, timeout=400).stdout
    multi = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    r = run(["basebn.test", *args, single_out])
    assert r.returncode == 0, r.stderr
    single = json.loads(r.stdout.strip().splitlines()[-1])
    assert multi["images"] == single["images"] == 37
    a, b = load_checkpoint(multi_out)["model"], load_checkpoint(single_out)["model"]
    # the first BN layer's inputs do not depend on how images are batched: its statistics, pooled over the
    # three ranks' shards, equal one process's. Deeper layers see inputs normalised by earlier layers' batch
    # statistics (the train-mode pass of precise BN), so they depend on the per-rank batches.
    for k in ("bn1.running_mean", "bn1.running_var"):
        np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-6, err_msg=k)
    assert abs(multi["top1"] - single["top1"]) <= 100 / 37 + 1e-9  # at most one image decided differently


def test_a_last_batch_of_one_image_is_one_line(tmp_path):
    """MobileNetV3 on 12 px images ends in BN on 1x1 maps: a last test batch of one image has one value per
    channel, too few for batch statistics."""
    from basebn.checkpoint import model_state, save_npz_weights
    from basebn.config import load_config
    from basebn.engine.build import build_model_from_cfg

    cfg = tmp_path / "cfg.py"
    cfg.write_text(CONFIG.replace('"resnet20", base_width=8', '"mbnetv3_small_x075"'))
    weights = str(tmp_path / "w.npz")
    save_npz_weights(weights, model_state(build_model_from_cfg(load_config(str(cfg)), in_channels=1)))
    r = run(["basebn.test", str(cfg), "-w", weights, "batch_size=199", "--adapt", "bn_batch"])  # 200 = 199 + 1
    assert r.returncode == 2 and "batch_size" in r.stderr and "Traceback" not in r.stderr
