"""basebn.tools.plot: BN drift numbers against numpy, and the PNGs it writes."""
import json

import numpy as np

import megengine as mge
import megengine.module as M

from basebn.tools import plot


class OneBN(M.Module):
    def __init__(self):
        super().__init__()
        self.bn = M.BatchNorm2d(3)

    def forward(self, x):
        return self.bn(x)


def test_bn_drift_against_numpy():
    rng = np.random.default_rng(0)
    data = (rng.standard_normal((40, 3, 4, 4)) * [[[[1.0]], [[2.0]], [[0.5]]]] + [[[[0.0]], [[3.0]], [[-1.0]]]])
    data = data.astype(np.float32)
    model = OneBN()
    run_mean = np.array([0.1, 2.5, -1.0], np.float32)
    run_var = np.array([1.0, 2.0, 0.5], np.float32)
    model.bn.running_mean._reset(mge.tensor(run_mean.reshape(1, 3, 1, 1)))
    model.bn.running_var._reset(mge.tensor(run_var.reshape(1, 3, 1, 1)))
    batches = [(data[i:i + 16], None) for i in range(0, 40, 16)]  # uneven last batch
    (name, mean_shift, var_ratio), = plot.bn_drift(model, batches, num_samples=40)
    flat = data.transpose(1, 0, 2, 3).reshape(3, -1).astype(np.float64)
    pop_mean, pop_var = flat.mean(1), flat.var(1, ddof=1)
    assert name == "bn"
    np.testing.assert_allclose(mean_shift, np.mean(np.abs(run_mean - pop_mean) / np.sqrt(pop_var)), rtol=1e-4)
    np.testing.assert_allclose(var_ratio, np.mean(run_var / pop_var), rtol=1e-4)


def test_curves_and_bn_stats_png(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"epoch": e, "top1": 50.0 + e, "top5": 90.0, "loss": 1.0 / e, "ema_top1": 40.0 + e} for e in (1, 2)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = plot.plot_curves([str(run)], str(tmp_path / "curves.png"))
    series = {"model": [("bn1", 0.01, 1.0), ("bn2", 0.02, 0.9)], "EMA": [("bn1", 0.03, 1.2), ("bn2", 0.0, 1.1)]}
    out2 = plot.plot_bn_stats(series, str(tmp_path / "bn.png"))
    for path in (out, out2):
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_missing_metrics_is_a_clear_error(tmp_path, capsys):
    assert plot.main([str(tmp_path)]) == 2
    assert "metrics.jsonl not found" in capsys.readouterr().err
