"""python -m basebn.deploy and basebn.test --backend on the tiny synthetic config: files that the peer runtimes
run like the eager model, top-1 through every backend equal to eager evaluation, one-line user errors."""
import json
import os
import sys

import numpy as np
import pytest

from basebn.config import load_config
from basebn.deploy import cli as deploy_cli
from basebn.deploy import eager_logits, run_exported
from basebn.deploy.cli import main as deploy_main
from basebn.engine.build import load_trained
import basebn.test as basebn_test

from .helpers import images

TOLERANCE = 1e-4


@pytest.mark.parametrize("fmt", ["mge", "onnx"])
def test_deploy_cli_writes_a_file_that_runs_like_the_eager_model(fmt, tiny, weights, tmp_path, capsys):
    out = str(tmp_path / f"model.{fmt}")
    assert deploy_main([tiny, "-w", weights, "--format", fmt, "-o", out, "--verify"]) == 0
    model, ds, _ = load_trained(load_config(tiny), weights)
    x = images((5, *ds.image_shape))
    assert np.max(np.abs(run_exported(out, x) - eager_logits(model, x))) <= TOLERANCE


def test_deploy_cli_input_size(tiny, weights, tmp_path):
    out = str(tmp_path / "model.onnx")
    assert deploy_main([tiny, "-w", weights, "--format", "onnx", "-o", out, "--input-size", "12", "--verify"]) == 0
    model, ds, _ = load_trained(load_config(tiny), weights)
    x = images((2, ds.image_shape[0], 12, 12))
    assert np.max(np.abs(run_exported(out, x) - eager_logits(model, x))) <= TOLERANCE


def _one_error_line(capsys):
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1
    return err[0]


def test_deploy_cli_wrong_extension_is_one_line(tiny, weights, tmp_path, capsys):
    assert deploy_main([tiny, "-w", weights, "--format", "onnx", "-o", str(tmp_path / "m.mge")]) == 2
    assert ".onnx" in _one_error_line(capsys)


def test_deploy_cli_without_onnx_names_the_extra(tiny, weights, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnx", None)  # import onnx raises ImportError
    assert deploy_main([tiny, "-w", weights, "--format", "onnx", "-o", str(tmp_path / "m.onnx")]) == 2
    assert 'pip install -e ".[deploy]"' in _one_error_line(capsys)


def test_deploy_cli_failed_verification_exits_2_and_writes_nothing(tiny, weights, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(deploy_cli, "compare_with_eager", lambda *a, **k: (0.5, 1.0))
    out = tmp_path / "m.mge"
    assert deploy_main([tiny, "-w", weights, "--format", "mge", "-o", str(out), "--verify"]) == 2
    assert "verification failed: max abs difference 0.5" in _one_error_line(capsys)
    assert sorted(os.listdir(tmp_path)) == ["tiny.py", "w.npz"]  # no file, no temp folder left


def test_test_backends_give_the_eager_metrics(tiny, weights, tmp_path):
    cfg = load_config(tiny)
    eager = basebn_test.test(cfg, weights)
    for backend in ("megengine", "lite", "onnxruntime"):
        m = basebn_test.test(cfg, weights, backend=backend)
        assert (m["images"], m["top1"], m["top5"]) == (eager["images"], eager["top1"], eager["top5"]), backend
        assert abs(m["loss"] - eager["loss"]) <= 1e-5, backend


def test_test_takes_an_exported_file(tiny, weights, tmp_path, capsys):
    out = str(tmp_path / "model.onnx")
    assert deploy_main([tiny, "-w", weights, "--format", "onnx", "-o", out]) == 0
    capsys.readouterr()
    assert basebn_test.main([tiny, "-w", out, "--json"]) == 0
    from_file = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    eager = basebn_test.test(load_config(tiny), weights)
    assert from_file["top1"] == eager["top1"] and abs(from_file["loss"] - eager["loss"]) <= 1e-5
    assert basebn_test.main([tiny, "-w", out, "--backend", "lite"]) == 2  # lite runs .mge files
    assert "lite runs .mge files" in _one_error_line(capsys)
