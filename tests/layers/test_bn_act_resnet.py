"""ResNet-20 on the fused BN-activation layers (basebn.layers.bn_act): one training step equals the unfused
model's (same weights and batch; the unfused model is built with ``with_act`` disabled), two runs are
bitwise identical at a fixed thread count, and the eval-time tools (conv-BN pairs, efficient conv-BN eval,
fuse_conv_bn) see every fused layer and keep its activation.
"""
import copy

import numpy as np
import pytest

import megengine as mge

import basebn.layers.bn_act as bn_act_module
import basebn.models.resnet as resnet_module
from basebn.layers import (
    BatchNormAct2d,
    enable_efficient_conv_bn_eval,
    find_conv_bn_pairs,
    fuse_conv_bn,
)
from basebn.layers.bn_act import has_act
from basebn.layers.norm import is_bn2d
from basebn.models import build_model
from basebn.ops import kernel_library
from tests.support.train_step import train_step


def _resnet(fused, monkeypatch, name="resnet20", **kw):
    """basebn's ResNet ``name`` (1 input channel for the CIFAR ones), with the fused layers or without."""
    kw = dict(dict(num_classes=10, in_channels=1 if name == "resnet20" else 3), **kw)
    if not fused:
        with monkeypatch.context() as m:
            m.setattr(resnet_module, "with_act", lambda norm, act: norm)
            return build_model(name, **kw)
    return build_model(name, **kw)


def _resnet20(fused, monkeypatch, **kw):
    return _resnet(fused, monkeypatch, **kw)


def _randomized(model, seed=0):
    """Non-trivial BN affine (zero-init residual gammas made non-zero) and running statistics."""
    rng = np.random.default_rng(seed)
    sd = {}
    for k, v in model.state_dict().items():
        if k.endswith("weight") and v.ndim == 4 and v.shape[0] == 1:  # a BN gamma (1, C, 1, 1)
            sd[k] = rng.uniform(0.5, 1.5, v.shape).astype(np.float32)
        elif k.endswith("bias") and v.ndim == 4 and v.shape[0] == 1:
            sd[k] = rng.normal(0, 0.3, v.shape).astype(np.float32)
        elif k.endswith("running_var"):
            sd[k] = rng.uniform(0.5, 2.0, v.shape).astype(np.float32)
        else:
            sd[k] = v
    model.load_state_dict(sd)
    return model


def _batch(seed=1, n=8, shape=(1, 28, 28)):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n,) + shape).astype(np.float32),
            rng.integers(0, 10, n).astype(np.int32))


def _rel_close(a, b, rtol, what):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    err, scale = np.abs(a - b).max(), np.abs(b).max()
    assert err <= rtol * max(scale, 1e-30), f"{what}: max err {err:.3g} vs scale {scale:.3g}"


def test_resnet20_builds_fused_layers_with_unchanged_keys(monkeypatch):
    fused, plain = _resnet20(True, monkeypatch), _resnet20(False, monkeypatch)
    assert list(fused.state_dict()) == list(plain.state_dict())
    acts = [m for m in fused.modules() if has_act(m)]
    # the stem BN, both BNs of every block (9 blocks); the 2 downsample BNs stay plain
    assert len(acts) == 1 + 2 * 9 and all(type(m) is BatchNormAct2d for m in acts)
    assert not [m for m in plain.modules() if has_act(m)]
    gn = _resnet20(True, monkeypatch, norm="GN")
    assert not [m for m in gn.modules() if has_act(m)]


@pytest.mark.parametrize("name,shape", [("resnet20", (1, 28, 28)), ("resnet18", (3, 32, 32))])
def test_train_step_equals_unfused(backend, monkeypatch, name, shape):
    """Same weights and batch: loss, every gradient and every running statistic within 1e-5 relative
    (ResNet-18: ImageNet stem, max pool, four stages)."""
    fused = _randomized(_resnet(True, monkeypatch, name))
    plain = _resnet(False, monkeypatch, name)
    plain.load_state_dict(fused.state_dict())
    x, labels = _batch(shape=shape)
    got, want = train_step(fused, x, labels), train_step(plain, x, labels)
    _rel_close(got[0], want[0], 1e-5, "loss")
    assert got[1].keys() == want[1].keys()
    for k in want[1]:
        _rel_close(got[1][k], want[1][k], 1e-5, f"gradient of {k}")
    for k in want[2]:
        _rel_close(got[2][k], want[2][k], 1e-5, k)


def test_train_step_is_bitwise_reproducible(monkeypatch):
    if not kernel_library.kernel_available():
        pytest.skip(f"BN kernels unavailable: {kernel_library.kernel_error()}")
    monkeypatch.setenv("BASEBN_NUM_THREADS", "2")
    x, labels = _batch(seed=2, n=16)
    weights = _randomized(_resnet20(True, monkeypatch)).state_dict()
    runs = []
    for _ in range(2):
        model = _resnet20(True, monkeypatch)
        model.load_state_dict(weights)
        runs.append(train_step(model, x, labels))
    assert runs[0][0] == runs[1][0]
    for k in runs[0][1]:
        np.testing.assert_array_equal(runs[0][1][k], runs[1][1][k], err_msg=k)
    for k in runs[0][2]:
        np.testing.assert_array_equal(runs[0][2][k], runs[1][2][k], err_msg=k)


def test_conv_bn_tools_pair_every_fused_layer(backend, monkeypatch):
    """Every BN pairs with its conv (the residual bn2, called with a shortcut, too); efficient conv-BN eval
    and fuse_conv_bn give the plain eval output, with the activations applied."""
    model = _randomized(_resnet20(True, monkeypatch), seed=3)
    model.eval()
    x = mge.tensor(_batch(seed=4, n=2)[0])
    want = model(x).numpy()
    pairs = find_conv_bn_pairs(model, x)
    bns = [n for n, m in model.named_modules() if is_bn2d(m)]
    assert sorted(b for _, b in pairs) == sorted(bns)
    fused = fuse_conv_bn(model, x)
    assert not [m for m in fused.modules() if is_bn2d(m)]
    _rel_close(fused(x).numpy(), want, 1e-5, "fuse_conv_bn")
    efficient = copy.deepcopy(model)
    assert len(enable_efficient_conv_bn_eval(efficient, x)) == len(bns)
    _rel_close(efficient(x).numpy(), want, 1e-5, "efficient conv-BN eval")


@pytest.mark.parametrize("name", ["resnet18d", "se_resnet18", "resnext50_32x4d"])
def test_anynet_resnets_step_equals_unfused(backend, monkeypatch, name):
    """basecls-layout ResNets (deep stem, SE: last BN not fused, grouped bottlenecks): same keys, and one
    training step's loss, gradients and running statistics equal the unfused model's."""
    fused = build_model(name, num_classes=10)
    with monkeypatch.context() as m:
        m.setattr(bn_act_module, "with_act", lambda norm, act: norm)
        plain = build_model(name, num_classes=10)
    assert [m for m in fused.modules() if has_act(m)] and not [m for m in plain.modules() if has_act(m)]
    assert list(fused.state_dict()) == list(plain.state_dict())
    _randomized(fused, seed=5)
    plain.load_state_dict(fused.state_dict())
    rng = np.random.default_rng(6)
    x, labels = rng.standard_normal((4, 3, 32, 32)).astype(np.float32), rng.integers(0, 10, 4).astype(np.int32)
    got, want = train_step(fused, x, labels), train_step(plain, x, labels)
    _rel_close(got[0], want[0], 1e-5, "loss")
    for k in want[1]:
        _rel_close(got[1][k], want[1][k], 1e-5, f"gradient of {k}")
    for k in want[2]:
        _rel_close(got[2][k], want[2][k], 1e-5, k)
