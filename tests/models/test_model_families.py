"""Every model name builds and runs; parameter counts and state-dict layouts (sorted key/shape lists)
equal basecls's (tests/fixtures/basecls_param_counts.json).

Inputs are tiny (2 images, 32 px; 8 px for the 32-px families). The count test builds each model at
1000 classes with MegEngine's initialisers switched off (values do not change the count), and
frees it before the next (MegEngine releases deleted tensors asynchronously).
"""
import gc
import json
import os

import numpy as np
import pytest

import megengine as mge
import megengine.module as M

from basebn.checkpoint import save_npz_weights
from basebn.layers.activation import build_activation
from basebn.layers.channel_shuffle import channel_shuffle, shuffle_split
from basebn.layers.divisible import make_divisible
from basebn.layers.drop_path import DropPath
from basebn.layers.pooling import AdaptiveAvgPool2d
from basebn.layers.se import SqueezeExcite, se_width
from basebn.models import MODEL_TABLE, build_model, list_models, load_weights, model_info, reparameterize
from basebn.tools.summary import state_dict_sha256
from tests.support import ROOT
from tests.support.initialisers import initialisers_off

FIXTURE = os.path.join(ROOT, "tests", "fixtures", "basecls_param_counts.json")
with open(FIXTURE) as f:
    BASECLS = json.load(f)
TINY_INPUT = {"cifar_resnet": 8, "wide_resnet": 8}  # global-pooled 32-px families; others need 32 (/32)
BIG = 60_000_000  # models above this many parameters: their build-and-run test is marked slow
TORCHVISION_KEYS = {"resnet18", "resnet34", "resnet50"}  # basebn's own ResNets keep their (zoo) key names


def _marks(name):
    return [pytest.mark.slow] if BASECLS["params"].get(name, 0) > BIG else []


def _free():
    gc.collect()
    mge._full_sync()


def num_params(model):
    return int(sum(p.size for p in model.parameters()))


@pytest.fixture
def no_init():
    with initialisers_off():
        yield


def test_table_names_and_info():
    names = list_models()
    assert len(names) == len(set(names)) == len(MODEL_TABLE)
    for name in ("resnet20", "resnet32", "resnet44", "resnet56", "resnet110", "wrn_16_8", "wrn_28_10", "wrn_40_4",
                 "resnet18", "resnet152d", "resnext50_32x4d", "se_resnet50", "wide_resnet50_2", "regnetx_002",
                 "regnety_320", "mbnetv2_x035", "mbnetv2_x140", "mbnetv3_small_x100", "mbnetv3_large_x100",
                 "effnet_b0", "effnet_b4", "snetv2_x050", "snetv2_x200", "repvgg_a0", "repvgg_b2g4", "vgg11_bn",
                 "vgg19_bn"):
        assert name in names
    assert model_info("effnet_b3")["input_size"] == 300
    assert model_info("resnet20") == dict(name="resnet20", family="cifar_resnet", input_size=32)
    assert list_models("vgg_bn") == ["vgg11_bn", "vgg13_bn", "vgg16_bn", "vgg19_bn"]
    with pytest.raises(ValueError, match="unknown model 'resnet9'"):
        build_model("resnet9")


def test_fixture_covers_every_shared_basecls_name():
    shared = set(BASECLS["params"])
    assert BASECLS["basecls_commit"] and BASECLS["command"]
    assert not shared - set(list_models())
    # everything of basecls that basebn lacks is a non-BN architecture, HRNet or effnet_l2 (480 M parameters)
    for name in BASECLS["basecls_only"]:
        assert name.startswith(("vit_", "swin_", "resmlp_", "hrnet_", "vgg")) or name == "effnet_l2", name
        assert not name.endswith("_bn")


@pytest.mark.parametrize("name", [pytest.param(n, marks=_marks(n)) for n in list_models()])
def test_builds_and_runs(name):
    size = TINY_INPUT.get(model_info(name)["family"], 32)
    model = build_model(name, num_classes=10)
    assert model.default_input_size == model_info(name)["input_size"]
    model.eval()
    out = model(mge.tensor(np.random.default_rng(0).normal(size=(2, 3, size, size)).astype(np.float32)))
    assert out.shape == (2, 10)
    assert np.isfinite(out.numpy()).all()
    del model, out
    _free()


@pytest.mark.parametrize("name", list(BASECLS["params"]))
def test_param_count_and_keys_equal_basecls(name, no_init):
    model = build_model(name)
    assert num_params(model) == BASECLS["params"][name]
    if name not in TORCHVISION_KEYS:  # same state-dict keys and shapes: basecls checkpoints load as they are
        assert state_dict_sha256(model) == BASECLS["state_dict_sha256"][name]
    del model
    _free()


@pytest.mark.parametrize("norm", ["BN", "SyncBN", "FrozenBN", "GN"])
def test_norm_kinds_and_bn_kwargs(norm):
    model = build_model("mbnetv3_small_x075", num_classes=10, norm=norm, in_channels=1, bn_momentum=0.97, bn_eps=1e-4)
    out = model(mge.tensor(np.ones((2, 1, 32, 32), np.float32)))
    assert out.shape == (2, 10)
    norms = [m for m in model.modules() if type(m).__name__ in ("BatchNorm2d", "SyncBatchNorm", "FrozenBatchNorm2d",
                                                                   "GroupNorm")]
    assert norms and all(m.eps == 1e-4 for m in norms)
    assert all(m.momentum == 0.97 for m in norms if norm in ("BN", "SyncBN"))


def test_family_bn_defaults():
    eff = build_model("effnet_b0_lite", num_classes=10)
    bns = [m for m in eff.modules() if isinstance(m, M.BatchNorm2d)]
    assert bns and all(m.momentum == 0.9 and m.eps == 1e-5 for m in bns)  # basecls's (its EfficientNets')
    net = build_model("resnet20", num_classes=10, bn_momentum=None, bn_eps=None)  # None: ResNet's own 0.9 / 1e-5
    assert all(m.momentum == 0.9 and m.eps == 1e-5 for m in net.modules() if isinstance(m, M.BatchNorm2d))


def test_existing_resnets_keep_their_kwargs_and_keys():
    model = build_model("resnet18", num_classes=10, in_channels=1, norm="BN", stem="small", bn_momentum=0.9,
                        bn_eps=1e-5, zero_init_residual=False, stem_stride=1, base_width=8)
    keys = set(model.state_dict())
    assert {"conv1.weight", "bn1.weight", "layer1.0.conv1.weight", "layer4.1.bn2.running_var", "fc.weight"} <= keys
    assert build_model("resnet110", num_classes=10, base_width=4)(mge.tensor(np.ones((1, 3, 8, 8), np.float32))).shape \
        == (1, 10)


def test_basecls_key_names():
    keys = set(build_model("resnet50d", num_classes=10).state_dict())
    assert {"stem.a.weight", "stem.c_bn.running_mean", "s1.b1.a.weight", "s2.b1.proj.weight", "s2.b1.bn.weight",
            "s4.b3.c_bn.weight", "head.fc.weight"} <= keys
    keys = set(build_model("mbnetv3_small_x075", num_classes=10).state_dict())
    assert {"stem.conv.weight", "s1.b1.dwise.weight", "s1.b1.se.f_ex.0.weight", "s2.b1.exp_bn.weight",
            "head.h_fc.weight", "head.fc.bias"} <= keys
    keys = set(build_model("snetv2_x050", num_classes=10).state_dict())
    assert {"stage0.0.branch_main.0.weight", "stage0.0.branch_proj.3.running_var", "head.conv.weight"} <= keys
    keys = set(build_model("wrn_16_8", num_classes=10).state_dict())
    assert {"conv1.weight", "block1.layer.0.bn1.weight", "block1.layer.0.convShortcut.weight", "bn1.weight",
            "fc.weight"} <= keys


def test_repvgg_reparameterize_equals_training_form():
    rng = np.random.default_rng(0)
    model = build_model("repvgg_b1g4", num_classes=10)
    for m in model.modules():  # non-trivial statistics so that every branch's fold matters
        if isinstance(m, M.BatchNorm2d):
            c = m.num_features
            m.running_mean[:] = mge.tensor(rng.normal(0, 0.2, (1, c, 1, 1)).astype(np.float32))
            m.running_var[:] = mge.tensor(rng.uniform(0.5, 2, (1, c, 1, 1)).astype(np.float32))
            m.bias[:] = mge.tensor(rng.normal(0, 0.2, (1, c, 1, 1)).astype(np.float32))
    model.eval()
    x = mge.tensor(rng.normal(size=(2, 3, 32, 32)).astype(np.float32))
    expected = model(x).numpy()
    reparameterize(model)
    keys = model.state_dict()
    assert not [k for k in keys if "rbr_dense" in k or "rbr_1x1" in k or "rbr_identity" in k]
    assert "stage1.1.rbr_reparam.bias" in keys and keys["stage1.1.rbr_reparam.weight"].shape == (4, 32, 32, 3, 3)
    np.testing.assert_allclose(model(x).numpy(), expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())
    deploy = build_model("repvgg_b1g4", num_classes=10, deploy=True)
    deploy.load_state_dict(model.state_dict())
    deploy.eval()
    np.testing.assert_allclose(deploy(x).numpy(), expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


# ---------------------------------------------------------------- shared blocks (basebn.layers, new files)
def _torch_adaptive_avg_pool(x, out):
    """numpy reference with PyTorch's bins: [floor(i*H/out), ceil((i+1)*H/out))."""
    n, c, h, w = x.shape
    res = np.zeros((n, c, out, out), x.dtype)
    for i in range(out):
        for j in range(out):
            hs, he = (i * h) // out, -(-(i + 1) * h // out)
            ws, we = (j * w) // out, -(-(j + 1) * w // out)
            res[:, :, i, j] = x[:, :, hs:he, ws:we].mean(axis=(2, 3))
    return res


@pytest.mark.parametrize("size", [1, 2, 5, 7, 9, 14])
def test_adaptive_avg_pool_matches_pytorch_bins(size):
    x = np.random.default_rng(size).normal(size=(2, 3, size, size)).astype(np.float32)
    out = AdaptiveAvgPool2d(7)(mge.tensor(x)).numpy()
    np.testing.assert_allclose(out, _torch_adaptive_avg_pool(x, 7), rtol=1e-5, atol=1e-6)


def test_channel_shuffle_and_split():
    x = np.arange(2 * 12 * 2 * 2, dtype=np.float32).reshape(2, 12, 2, 2)
    even, odd = shuffle_split(mge.tensor(x))
    np.testing.assert_array_equal(even.numpy(), x[:, 0::2])
    np.testing.assert_array_equal(odd.numpy(), x[:, 1::2])
    shuffled = channel_shuffle(mge.tensor(x), 3).numpy()  # channel g*4+i -> i*3+g
    np.testing.assert_array_equal(shuffled, x.reshape(2, 3, 4, 2, 2).transpose(0, 2, 1, 3, 4).reshape(2, 12, 2, 2))


def test_drop_path():
    x = mge.tensor(np.ones((64, 3, 2, 2), np.float32))
    layer = DropPath(0.5)
    layer.eval()
    np.testing.assert_array_equal(layer(x).numpy(), x.numpy())
    layer.train()
    per_sample = layer(x).numpy().reshape(64, -1)
    assert set(np.unique(per_sample)) <= {0.0, 2.0}  # whole samples dropped, survivors scaled by 1/(1-p)
    assert (per_sample.min(axis=1) == per_sample.max(axis=1)).all()
    assert 0 < (per_sample[:, 0] == 0).sum() < 64


def test_activations_and_widths():
    x = np.linspace(-5, 5, 11, dtype=np.float32)
    relu6 = np.clip(x + 3, 0, 6)
    expected = {"relu": np.maximum(x, 0), "relu6": np.clip(x, 0, 6), "hsigmoid": relu6 / 6, "hswish": x * relu6 / 6,
                "swish": x / (1 + np.exp(-x)), "silu": x / (1 + np.exp(-x)), "sigmoid": 1 / (1 + np.exp(-x))}
    for name, ref in expected.items():
        np.testing.assert_allclose(build_activation(name)(mge.tensor(x)).numpy(), ref, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="unknown activation 'mish'"):
        build_activation("mish")
    assert make_divisible(32 * 0.35, round_limit=0.9) == 16  # 8 would lose more than 10 %
    assert [se_width(w, r, rule) for w, r, rule in [(256, 0.0625, "divisible"), (24, 0.25, "round"),
            (72, 0.25, "divisible_0.9"), (30, 0.25, "floor"), (64, 0.0, "floor")]] == [16, 6, 24, 7, 0]
    se = SqueezeExcite(8, 2, "relu", hard_gate=True)
    assert set(se.state_dict()) == {"f_ex.0.weight", "f_ex.0.bias", "f_ex.2.weight", "f_ex.2.bias"}
    assert se(mge.tensor(np.ones((1, 8, 3, 3), np.float32))).shape == (1, 8, 3, 3)


@pytest.mark.parametrize("name, head, kwargs", [("resnet20", "fc", {}), ("mbnetv3_small_x100", "head.fc", {}),
                                                ("vgg11_bn", "head.classifier.6", dict(head_width=64)),
                                                ("regnetx_002", "head.fc", {})])
def test_weights_of_another_class_count_keep_a_new_head(tmp_path, name, head, kwargs):
    """Fine-tuning from weights trained for 10 classes into a 7-class model: only the classifier is new."""
    source = build_model(name, num_classes=10, **kwargs)
    path = str(tmp_path / "w.npz")
    save_npz_weights(path, {k: np.asarray(v) for k, v in source.state_dict().items()})
    target = build_model(name, num_classes=7, **kwargs)
    before = {k: np.asarray(v).copy() for k, v in target.state_dict().items()}
    load_weights(target, path, allow_new_head=True)
    after = target.state_dict()
    theirs = source.state_dict()
    for key in after:
        if key.startswith(head + "."):
            np.testing.assert_array_equal(after[key], before[key])  # the 7-class head stays as initialised
        else:
            np.testing.assert_array_equal(after[key], theirs[key])
