"""basebn.tools.bn_report / basebn.engine.bn_report: planted dead channels, NaN buffers and EMA drift are
found, population drift matches the BN-drift plot's numbers, a file that is not weights is one line."""
import json
import os

import numpy as np
import pytest

from basebn.checkpoint import model_state, save_checkpoint
from basebn.config import load_config
from basebn.engine.bn_report import build_report, ema_drift, population_drift, static_health
from basebn.engine.build import build_data, build_model_from_cfg
from basebn.tools.plot import bn_drift
from tests.support.cli import run


def _state(c=4):
    ones, zeros = np.ones((1, c, 1, 1), np.float32), np.zeros((1, c, 1, 1), np.float32)
    state = {}
    for name in ("a", "b", "c"):
        state.update({f"{name}.weight": ones.copy(), f"{name}.bias": zeros.copy(),
                      f"{name}.running_mean": zeros.copy(), f"{name}.running_var": ones.copy()})
    state["fc.weight"] = np.zeros((3, c), np.float32)
    return state


def test_static_health_finds_planted_problems_only():
    state = _state()
    state["a.weight"][0, 2] = 5e-4  # dead: |gamma| < 1e-3
    state["b.running_mean"][0, 1] = np.nan
    state["b.running_var"][0, 3] = np.inf
    state["c.running_var"][0, 0] = 1e-7  # dead: var < eps
    rows = {r["name"]: r for r in static_health(state, eps=1e-5)}
    assert sorted(rows) == ["a", "b", "c"]
    assert rows["a"]["dead"] == [2] and rows["b"]["dead"] == [] and rows["c"]["dead"] == [0]
    assert rows["b"]["non_finite"] == {"running_mean": 1, "running_var": 1}
    assert rows["a"]["non_finite"] == {} and rows["c"]["non_finite"] == {}
    report = build_report(state)
    assert report["summary"]["dead_channels"] == 2 and report["summary"]["layers_non_finite"] == 1
    assert report["verdict"][0].startswith("non-finite BN buffers in 1 of 3 layers")


def test_ema_drift_in_sigma_units():
    model, ema = _state(), _state()
    ema["b.running_var"][...] = 4.0
    model["b.running_mean"][...] = 1.0  # 1 / sqrt(4) = 0.5 sigma of the EMA's statistics
    rows = ema_drift(model, ema)
    assert rows["a"]["mean_shift"] == 0 and rows["a"]["var_ratio"] == 1
    assert rows["b"]["mean_shift"] == pytest.approx(0.5) and rows["b"]["var_ratio"] == pytest.approx(0.25)
    report = build_report(model, ema=rows)
    assert report["summary"]["layers_ema_drifting"] == 1


def test_population_drift_matches_the_bn_drift_plot(tiny):
    cfg = load_config(tiny)
    ds, loader = build_data(cfg, train=True)
    model = build_model_from_cfg(cfg, in_channels=1)
    loader.set_epoch(0)
    ours = population_drift(model, loader, 64)
    loader.set_epoch(0)
    theirs = bn_drift(model, loader, 64)
    assert len(theirs) == len(ours) > 10
    for name, shift, ratio in theirs:
        assert ours[name]["mean_shift"] == pytest.approx(shift, rel=1e-9)
        assert ours[name]["var_ratio"] == pytest.approx(ratio, rel=1e-9)


def test_cli_reports_planted_dead_channel_and_nan(tiny, tmp_path):
    cfg = load_config(tiny, ["model.zero_init_residual=False"])  # else every block's last gamma is 0: dead
    model = build_model_from_cfg(cfg, in_channels=1)
    state = {k: np.array(v) for k, v in model_state(model).items()}
    state["layer2.0.bn1.weight"].reshape(-1)[3] = 0.0
    state["layer3.1.bn2.running_mean"].reshape(-1)[5] = np.nan
    ema = {k: v.copy() for k, v in state.items()}
    path = str(tmp_path / "ckpt.npz")
    save_checkpoint(path, {"model": state, "ema": {"module": ema}})
    out = tmp_path / "report"
    r = run(["basebn.tools.bn_report", path, tiny, "--data-samples", "64", "--json", "--out", str(out)])
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout.strip().splitlines()[-1])
    dead = {row["name"]: row["dead"] for row in report["layers"] if row["dead"]}
    bad = {row["name"]: row["non_finite"] for row in report["layers"] if row["non_finite"]}
    assert dead == {"layer2.0.bn1": [3]}
    assert bad == {"layer3.1.bn2": {"running_mean": 1}}
    # a fresh model's running statistics (0 / 1) are far from its population statistics
    assert report["verdict"][-1].startswith("precise BN recommended: ")
    assert report["ema_checked"] and report["summary"]["layers_ema_drifting"] == 0
    assert os.path.isfile(out / "bn_report.txt") and os.path.isfile(out / "bn_report.json")
    pytest.importorskip("matplotlib")
    assert os.path.getsize(out / "bn_report.png") > 0


@pytest.mark.parametrize("content", [b"just text\n", None])
def test_cli_refuses_a_file_that_is_not_weights(tmp_path, content):
    path = tmp_path / "model.npz"
    if content is None:
        np.savez(path, x=np.zeros(3))  # an .npz, but not basebn weights
    else:
        path.write_bytes(content)
    r = run(["basebn.tools.bn_report", str(path)])
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len([line for line in r.stderr.splitlines() if line.startswith("error:")]) == 1
