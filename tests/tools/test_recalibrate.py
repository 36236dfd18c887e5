"""python -m basebn.tools.recalibrate: BN statistics re-estimated on the training data (numpy reference),
weights kept, overwrites and bad inputs refused with one line."""
import os

import megengine as mge
import numpy as np
import pytest

from basebn.checkpoint import load_checkpoint, model_state, save_npz_weights
from basebn.config import load_config
from basebn.data import build_dataset, build_loader
from basebn.engine.build import build_model_from_cfg
from tests.support.cli import run

PLAIN = ["data.pad=0", "data.hflip=False"]  # no augmentation: the reference sees the same images


@pytest.fixture
def weights(tiny, tmp_path):
    """A freshly initialised tiny model (running statistics 0 / 1) as a weights file."""
    cfg = load_config(tiny)
    model = build_model_from_cfg(cfg, in_channels=1)
    path = str(tmp_path / "w.npz")
    save_npz_weights(path, model_state(model))
    return path


def _first_bn_population(tiny, weights, overrides):
    """Pooled mean / unbiased variance of bn1's input (conv1 of every normalised training image)."""
    cfg = load_config(tiny, overrides)
    model = build_model_from_cfg(cfg, in_channels=1)
    model.load_state_dict({k: v for k, v in load_checkpoint(weights)["model"].items()})
    ds = build_dataset(cfg.data, train=True)
    loader = build_loader(cfg.data, ds, 32, train=False)
    h = np.concatenate([model.conv1(mge.tensor(images)).numpy() for images, _ in loader]).astype(np.float64)
    return len(ds), h.mean(axis=(0, 2, 3)), h.var(axis=(0, 2, 3), ddof=1)


def test_recalibrate_writes_population_statistics_and_keeps_weights(tiny, weights, tmp_path):
    out = str(tmp_path / "out.npz")
    overrides = [*PLAIN, "data.image_size=12"]  # another resolution than the config's 8
    r = run(["basebn.tools.recalibrate", tiny, "-w", weights, "-o", out, *overrides])
    assert r.returncode == 0, r.stderr
    n, mean, var = _first_bn_population(tiny, weights, overrides)
    state, source = load_checkpoint(out)["model"], load_checkpoint(weights)["model"]
    np.testing.assert_allclose(state["bn1.running_mean"].ravel(), mean, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(state["bn1.running_var"].ravel(), var, rtol=1e-4, atol=1e-5)
    assert f"from {n} training samples" in r.stderr
    for k in source:
        if not k.endswith(("running_mean", "running_var")):
            np.testing.assert_array_equal(state[k], source[k])
    r = run(["basebn.test", tiny, "-w", out, "data.image_size=12"])
    assert r.returncode == 0, r.stderr


def test_recalibrate_refuses_to_overwrite_without_force(tiny, weights, tmp_path):
    out = tmp_path / "out.npz"
    out.write_bytes(b"keep me")
    r = run(["basebn.tools.recalibrate", tiny, "-w", weights, "-o", str(out), "--num-samples", "32"])
    assert r.returncode == 2 and "exists" in r.stderr and "--force" in r.stderr and "Traceback" not in r.stderr
    assert out.read_bytes() == b"keep me"
    r = run(["basebn.tools.recalibrate", tiny, "-w", weights, "-o", str(out), "--num-samples", "32", "--force"])
    assert r.returncode == 0, r.stderr
    assert "bn1.running_var" in load_checkpoint(str(out))["model"]


@pytest.mark.parametrize("case", ["not_npz", "zero_samples", "not_weights", "missing", "bad_key", "no_dir"])
def test_recalibrate_bad_inputs_are_one_line(tiny, weights, tmp_path, case):
    text = tmp_path / "notes.txt"
    text.write_text("not weights")
    out = str(tmp_path / "out.npz")
    args = {"not_npz": ["-w", weights, "-o", str(tmp_path / "out.pkl")],
            "zero_samples": ["-w", weights, "-o", out, "--num-samples", "0"],
            "not_weights": ["-w", str(text), "-o", out],
            "missing": ["-w", str(tmp_path / "nope.npz"), "-o", out],
            "bad_key": ["-w", weights, "-o", out, "data.image_sise=12"],
            "no_dir": ["-w", weights, "-o", str(tmp_path / "no" / "out.npz")]}[case]
    r = run(["basebn.tools.recalibrate", tiny, *args])
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert len([line for line in r.stderr.splitlines() if line.startswith("error:")]) == 1
    assert not os.path.exists(out)
