"""Every model family exports to .mge and ONNX and runs there like the eager model: MegEngine Lite and
onnxruntime (the peer runtimes) against basebn's eager eval output, max abs difference <= 1e-4 (times the
largest |logit| when that is above 1, and at least twice what folding BN into the convs alone changes in eager
MegEngine: float32 rounding that a 101-layer net with random weights amplifies to ~3e-4), on a batch size other
than the traced one. One small name per family here; every name with -m slow."""
import numpy as np
import pytest

import megengine as mge

from basebn.deploy import eager_logits, max_abs_difference, prepare_for_export
from basebn.models import MODEL_TABLE, build_model, list_models

from .helpers import export_both, images, randomize_bn, scaled_tolerance

TOLERANCE = 1e-4
# family -> (name, constructor kwargs that keep it small); 32 px inputs
REPRESENTATIVES = {
    "cifar_resnet": ("resnet20", {}),
    "resnet": ("resnet18", {}),
    "wide_resnet": ("wrn_16_8", {}),
    "resnet-d": ("resnet18d", {}),
    "resnext": ("resnext50_32x4d", {}),
    "se-resnet": ("se_resnet18", {}),
    "wide (basecls)": ("wide_resnet50_2", {}),
    "regnetx": ("regnetx_002", {}),
    "regnety": ("regnety_002", {}),
    "mbnetv1": ("mbnetv1_x025", {}),
    "mbnetv2": ("mbnetv2_x035", {}),
    "mbnetv3": ("mbnetv3_small_x075", {}),
    "effnet": ("effnet_b0", {}),
    "effnet_lite": ("effnet_b0_lite", {}),
    "effnetv2": ("effnetv2_b0", {}),
    "snetv2": ("snetv2_x050", {}),
    "snetv2p": ("snetv2p_x075", {}),
    "repvgg": ("repvgg_a0", {}),
    "vgg_bn": ("vgg11_bn", dict(widths=(8, 8, 16, 16, 16), head_width=32)),
    "hrnet": ("hrnet_w18_small_v1", {}),
}


def _check(name, kwargs, tmp_path, size=32):
    mge.random.seed(0)  # the same initial weights every run
    model = randomize_bn(build_model(name, num_classes=10, in_channels=3, **kwargs), input_shape=(3, size, size))
    batch = images((3, 3, size, size))  # traced at batch 2
    prepared = prepare_for_export(model, batch)  # what both files are exported from
    folding_noise = np.abs(eager_logits(prepared, batch) - eager_logits(model, batch)).max()
    mge_path, onnx_path, traced = export_both(prepared, tmp_path, (2, 3, size, size))
    tolerance = max(scaled_tolerance(model, batch, TOLERANCE), 2 * float(folding_noise))
    for path in (mge_path, onnx_path):
        assert max_abs_difference(model, path, batch) <= tolerance, path
    return traced


def test_every_family_has_a_representative():
    families = {entry[1] for entry in MODEL_TABLE.values()}
    covered = {MODEL_TABLE[name][1] for name, _ in REPRESENTATIVES.values()}
    assert families <= covered, f"families without a deploy test: {sorted(families - covered)}"


# wide_resnet50_2 has 69M parameters (a 275 MB graph): slow; its bottleneck blocks are ResNeXt-50's code path
SLOW_FAMILIES = {"wide (basecls)"}


@pytest.mark.parametrize("family", [pytest.param(f, marks=pytest.mark.slow) if f in SLOW_FAMILIES else f
                                    for f in sorted(REPRESENTATIVES)])
def test_family_exports_and_matches_eager(family, tmp_path):
    name, kwargs = REPRESENTATIVES[family]
    _check(name, kwargs, tmp_path)


@pytest.mark.exhaustive
@pytest.mark.parametrize("name", list_models())
def test_every_model_exports_and_matches_eager(name, tmp_path):
    _check(name, dict(REPRESENTATIVES["vgg_bn"][1]) if name.startswith("vgg") else {}, tmp_path, size=64)
