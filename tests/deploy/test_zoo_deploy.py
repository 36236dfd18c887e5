"""A zoo entry exported to ONNX and .mge reproduces its recorded top-1 on the 10k Fashion-MNIST test set in
onnxruntime and in MegEngine Lite (skipped without Fashion-MNIST)."""
import os

import pytest

import basebn.zoo as zoo
from basebn.data.idx import FASHION_MNIST_DEFAULT_ROOT
from basebn.deploy import export_mge, export_onnx, load_exported
from basebn.deploy.evaluate import evaluate_exported
from basebn.engine.build import load_trained, zoo_config

ENTRY = "fmnist_r20_fullres_restart2"


@pytest.mark.skipif(not os.path.isdir(FASHION_MNIST_DEFAULT_ROOT), reason="Fashion-MNIST not installed")
@pytest.mark.parametrize("fmt,backend", [("onnx", "onnxruntime"),
                                         pytest.param("mge", "lite", marks=pytest.mark.slow)])  # ~35 s: 1 thread
def test_exported_zoo_entry_reproduces_recorded_top1(fmt, backend, tmp_path):
    entry = zoo.get_entry(ENTRY)
    model, ds, loader = load_trained(zoo_config(ENTRY), "zoo:" + ENTRY)
    path = str(tmp_path / f"model.{fmt}")
    {"onnx": export_onnx, "mge": export_mge}[fmt](model, path, (2, *ds.image_shape))
    metrics = evaluate_exported(load_exported(path, backend), loader)
    assert metrics["images"] == 10000
    assert abs(metrics["top1"] - entry["top1"]) <= 0.05
