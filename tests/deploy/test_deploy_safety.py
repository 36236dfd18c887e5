"""Issue R on deploy: GroupNorm models export (8), -o never overwrites without --force (9), --verify's bound is
relative to the logits' magnitude, and an exported file evaluated on data it was not exported for fails in one
line before running."""
import os
import stat

import numpy as np
import pytest

import megengine as mge
import megengine.module as M

import basebn.test as basebn_test
from basebn.checkpoint import save_npz_weights
from basebn.config import load_config
from basebn.deploy import eager_logits, export_mge, export_onnx, prepare_for_export, run_exported
from basebn.deploy.cli import main as deploy_main
from basebn.engine.build import build_data, build_model_from_cfg, load_trained
from basebn.models import build_model

from .helpers import images

RTOL = 1e-4


def _one_error_line(capsys):
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1, err
    return err[0]


def _randomize_gn(model, seed=0):
    """Random per-channel affine values in every GroupNorm (fresh ones are 1/0)."""
    rng = np.random.default_rng(seed)
    for m in model.modules():
        if isinstance(m, M.GroupNorm):
            m.weight._reset(mge.Tensor(rng.uniform(0.5, 1.5, m.weight.shape).astype(np.float32)))
            m.bias._reset(mge.Tensor(rng.uniform(-0.3, 0.3, m.bias.shape).astype(np.float32)))
    return model


def _numpy_group_norm(x, groups, weight, bias, eps):
    """GroupNorm from its definition (Wu & He 2018), in float64."""
    n, c = x.shape[:2]
    g = x.astype(np.float64).reshape(n, groups, -1)
    y = (g - g.mean(axis=2, keepdims=True)) / np.sqrt(g.var(axis=2, keepdims=True) + eps)
    return y.reshape(x.shape) * weight.reshape(1, c, 1, 1) + bias.reshape(1, c, 1, 1)


def test_group_norm_ops_compute_group_norm():
    from basebn.deploy.prepare import GroupNormOps  # here, so that the other tests also run on older code

    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 8, 5, 4)).astype(np.float32) * 2 + 1
    weight, bias = rng.uniform(0.5, 1.5, 8), rng.uniform(-1, 1, 8)
    got = GroupNormOps(4, weight, bias, 1e-5)(mge.tensor(x)).numpy()
    np.testing.assert_allclose(got, _numpy_group_norm(x, 4, weight, bias, 1e-5), rtol=0, atol=1e-5)


@pytest.mark.parametrize("fmt", ["mge", "onnx"])
def test_group_norm_model_exports_and_runs_like_megengine(fmt, tmp_path):
    """Defect 8: a model.norm=GN ResNet exports; Lite / GraphInference / onnxruntime give MegEngine's own
    (eager GroupNorm) logits, at the traced size and at another one (the image size stays free)."""
    model = _randomize_gn(build_model("resnet20", num_classes=10, in_channels=3, norm="GN", base_width=8))
    model.eval()
    path = str(tmp_path / f"gn.{fmt}")
    traced = (export_mge if fmt == "mge" else export_onnx)(model, path, (2, 3, 16, 16))
    assert traced.spatial_free
    for shape in ((5, 3, 16, 16), (2, 3, 24, 20)):
        x = images(shape)
        expected = eager_logits(model, x)
        for backend in (("lite", "megengine") if fmt == "mge" else ("onnxruntime",)):
            got = run_exported(path, x, backend=backend)
            assert np.max(np.abs(got - expected)) <= RTOL * max(1.0, np.abs(expected).max()), (backend, shape)
    prepared = prepare_for_export(model, np.zeros((2, 3, 16, 16), np.float32))
    assert not [m for m in prepared.modules() if isinstance(m, M.GroupNorm)]


def test_group_norm_through_the_clis(tiny, tmp_path, capsys):
    """deploy --verify and basebn.test --backend onnxruntime|lite take a model.norm=GN config."""
    cfg = load_config(tiny, ["model.norm=GN"])
    ds, _ = build_data(cfg, train=False)
    model = _randomize_gn(build_model_from_cfg(cfg, in_channels=ds.image_shape[0]))
    weights = str(tmp_path / "gn.npz")
    save_npz_weights(weights, {k: np.asarray(v) for k, v in model.state_dict().items()})
    out = str(tmp_path / "gn.onnx")
    assert deploy_main([tiny, "model.norm=GN", "-w", weights, "--format", "onnx", "-o", out, "--verify"]) == 0
    eager = basebn_test.test(cfg, weights)
    for backend in ("onnxruntime", "lite"):
        m = basebn_test.test(cfg, weights, backend=backend)
        assert (m["images"], m["top1"], m["top5"]) == (eager["images"], eager["top1"], eager["top5"]), backend


def test_existing_output_is_kept_without_force(tiny, weights, tmp_path, capsys):
    """Defect 9: -o EXISTING refuses (exit 2, one line naming --force); the file keeps its bytes and mode."""
    out = tmp_path / "model.onnx"
    out.write_bytes(b"the user's own file")
    os.chmod(out, 0o640)
    assert deploy_main([tiny, "-w", weights, "--format", "onnx", "-o", str(out)]) == 2
    assert "--force" in _one_error_line(capsys)
    assert out.read_bytes() == b"the user's own file"
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o640
    assert deploy_main([tiny, "-w", weights, "--format", "onnx", "-o", str(out), "--force", "--verify"]) == 0
    assert out.read_bytes()[:2] != b"th" and stat.S_IMODE(os.stat(out).st_mode) == 0o640
    model, ds, _ = load_trained(load_config(tiny), weights)
    x = images((3, *ds.image_shape))
    assert np.max(np.abs(run_exported(str(out), x) - eager_logits(model, x))) <= RTOL


def test_failed_verification_with_force_keeps_the_old_file(tiny, weights, tmp_path, capsys, monkeypatch):
    import basebn.deploy.cli as deploy_cli

    out = tmp_path / "model.mge"
    out.write_bytes(b"previous export")
    monkeypatch.setattr(deploy_cli, "compare_with_eager", lambda *a, **k: (0.5, 1.0))
    assert deploy_main([tiny, "-w", weights, "--format", "mge", "-o", str(out), "--force", "--verify"]) == 2
    assert "verification failed" in _one_error_line(capsys)
    assert out.read_bytes() == b"previous export"
    assert sorted(os.listdir(tmp_path)) == ["model.mge", "tiny.py", "w.npz"]


def test_verify_bound_is_relative_to_the_logits(tiny, weights, tmp_path):
    """A correct export whose logits are ~1e4 differs from the eager model by more than 1e-4 in absolute terms
    (float32 steps there are ~1e-3): --verify accepts it and keeps the file."""
    with np.load(weights) as z:
        state = {k[len("model/"):]: z[k] for k in z.files if k.startswith("model/")}
    state["fc.weight"] = state["fc.weight"] * 2e4
    big = str(tmp_path / "big.npz")
    save_npz_weights(big, state)
    out = str(tmp_path / "big.mge")
    assert deploy_main([tiny, "-w", big, "--format", "mge", "-o", out, "--verify"]) == 0
    assert os.path.isfile(out)
    model, ds, loader = load_trained(load_config(tiny), big)
    x = np.asarray(next(iter(loader))[0][:16], np.float32)  # the batch --verify uses
    expected, got = eager_logits(model, x), run_exported(out, x)
    assert np.abs(expected).max() > 1e3
    diff = np.max(np.abs(got.astype(np.float64) - expected))
    assert 1e-4 < diff <= RTOL * np.abs(expected).max()  # the old absolute bound would have rejected it


@pytest.mark.parametrize("classes, channels, says", [(7, 1, "gives 7 class scores"), (10, 3, "takes 3-channel")])
@pytest.mark.parametrize("fmt", ["mge", "onnx"])
def test_exported_file_on_other_data_fails_before_running(fmt, classes, channels, says, tiny, tmp_path, capsys,
                                                          monkeypatch):
    """A file exported for 7 classes, or for 3-channel images, evaluated on the tiny config's data (10 classes,
    1 channel): one line naming the file and the mismatch, and no batch is run."""
    model = build_model("resnet20", num_classes=classes, in_channels=channels, base_width=4)
    out = str(tmp_path / f"model.{fmt}")
    (export_mge if fmt == "mge" else export_onnx)(model, out, (2, channels, 8, 8))
    calls = []
    monkeypatch.setattr(basebn_test, "evaluate_exported", lambda *a, **k: calls.append(a))
    assert basebn_test.main([tiny, "-w", out]) == 2
    line = _one_error_line(capsys)
    assert says in line and out in line
    assert calls == []  # nothing was run
