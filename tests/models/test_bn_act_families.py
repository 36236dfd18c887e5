"""The fused BN-activation layers (basebn.layers.bn_act) in every family besides the ResNets
(tests/layers/test_bn_act_resnet.py): one small model per family, built once as usual and once with ``with_act``
disabled (the plain MegEngine BN -> activation graph, the reference). Same module names and state-dict keys;
one training step gives the same loss, parameter gradients and BN running statistics; deploy-time conv-BN fusion
(RepVGG: reparameterisation) keeps the eval output. SyncBN and FrozenBN fuse too, GN does not. ~45 s on 2 busy
cores.
"""
import functools
from collections import Counter

import numpy as np
import pytest

import megengine as mge

import basebn.layers.bn_act as bn_act_module
from basebn.layers import fuse_conv_bn
from basebn.ops import bn_ops
from basebn.layers.bn_act import FrozenBatchNormAct2d, SyncBatchNormAct2d, has_act
from basebn.layers.norm import is_bn
from basebn.models import build_model, reparameterize
from basebn.models.regnet import RegNet
from tests.support.megengine_bug import first_repeated
from tests.support.train_step import train_step

RTOL = 1e-5
# three stages (the third fuses three scales: a two-step down path), one block per branch, narrow
HRNET_SMALL = dict(stage_modules=[1, 1, 1], stage_blocks=[[1], [1, 1], [1, 1, 1]], w_stem=16,
                   stage_channels=[[8], [8, 16], [8, 16, 32]], merge_channels=(8, 16, 32), head_width=64)
# case: (model name or constructor, kwargs keeping it small (fewer blocks, every block kind kept), {activation:
# number of BNs followed by it}). The BNs of fusable activations (bn_ops.ACTIVATIONS) must fuse, the others not.
# Inputs: 32 px, batch 4. The runtime is mostly fuse_conv_bn's trace, which grows with the module count.
CASES = {
    # regnety_002's parameters at depth 4 (stages of 1, 1, 2 blocks): stem + a/b/c of every block (c: BN +
    # residual add + ReLU; SE sits in the b branch); the shortcut BNs stay plain
    "regnety": (functools.partial(RegNet, 4, 24, 36.44, 2.49, 8, se_r=0.25), {}, {"relu": 13}),
    "mbnetv1": ("mbnetv1_x025", dict(depths=[1, 1, 1, 2, 1]), {"relu6": 13}),  # project BNs too (has_proj_act)
    # expand + depthwise BNs, stem, head; project BNs (no activation after the skip add) stay plain
    "mbnetv2": ("mbnetv2_x035", dict(depths=[1, 2, 1, 1, 1, 1, 1]), {"relu6": 17}),
    "mbnetv3": ("mbnetv3_small_x075", dict(depths=[1, 2, 1, 1, 1], exp_rs=[1, [4.5, 3.67], 4, 3, 6]),
                {"relu": 5, "hswish": 8}),  # relu stages, hswish stages, SE, MBV3Head
    "effnet_lite": ("effnet_b0_lite", dict(width_mult=0.5, depths=[1, 2, 1, 1, 1, 1, 1]), {"relu6": 17}),
    # SiLU after the stem, expand, depthwise and head BNs (SE follows the depthwise activation)
    "effnet_silu": ("effnet_b0", dict(width_mult=0.5, depths=[1, 2, 1, 1, 1, 1, 1]), {"silu": 17}),
    "effnetv2": ("effnetv2_b0", dict(width_mult=0.5, depths=[2, 2, 1, 2, 1, 1], act="relu"), {"relu": 15}),
    "snetv2": ("snetv2_x050", dict(depths=[2, 2, 2]), {"relu": 17}),
    "snetv2p": ("snetv2p_x075", dict(widths=[24, 48, 96, 192], depths=[2, 1, 1, 2],
                                     kernels=[[3, "x"], [5], [7], ["x", 7]]), {"relu": 6, "hswish": 14}),
    "vgg_bn": ("vgg11_bn", dict(widths=(8, 8, 16, 16, 16), head_width=32), {"relu": 8}),
    # stem, transitions, fusion down-paths but their last norm (summed), merge, blocks; shortcut BNs plain
    "hrnet": ("hrnet_w18_small_v1", HRNET_SMALL, {"relu": 31}),
    "repvgg": ("repvgg_a0", dict(num_blocks=[1, 1, 2, 1]), {}),  # three branches summed before the act: none
}


# Input size where 32 px leaves the last BNs (the heads, on 1x1 maps) normalising over the 4 samples only: there
# the unfused reference disagrees with itself when the batch is merely permuted (head conv weight gradient,
# measured: mbnetv3 8e-6, snetv2p 6e-6, effnet_silu 5e-5 relative), RTOL's order or above; at 64 px those BNs
# see 16 values. (The ReLU cases pass at 32 px: their activation derivative is exact in float32.)
INPUT_SIZE = {"mbnetv3": 64, "snetv2p": 64, "effnet_silu": 64}
# A gradient tolerance above RTOL where the two models compute the activation differently, not only in another
# order: the fused SiLU takes exp from bn_expf (within 1 ulp of expf), MegEngine's SiLU from its own exp, so the
# derivative differs by an ulp or two per element; after the per-channel sums that is ~1e-5 relative (measured
# 1.02e-5 to 1.3e-5 on EfficientNet's exp_bn / SE biases in about one run in six, beyond the reordering noise).
GRAD_RTOL = {"effnet_silu": 2e-5}


def _expected_acts(case):
    """{activation: count} of the BNs that must carry their activation (a fused form exists today)."""
    return {act: n for act, n in CASES[case][2].items() if act in bn_ops.ACTIVATIONS and n}


def _build(case, fused, monkeypatch, **kw):
    name, kwargs, _ = CASES[case]
    kwargs = dict(kwargs, num_classes=10, **kw)
    build = functools.partial(build_model, name) if isinstance(name, str) else name
    if fused:
        return build(**kwargs)
    with monkeypatch.context() as m:
        m.setattr(bn_act_module, "with_act", lambda norm, act: norm)
        return build(**kwargs)


def _randomized(model, seed=0):
    """Non-trivial BN affine and running statistics (fresh ones are 1/0, which hide mistakes)."""
    rng = np.random.default_rng(seed)
    for m in model.modules():
        if is_bn(m):
            shape = m.running_mean.shape
            for attr, values in (("weight", rng.uniform(0.5, 1.5, shape)), ("bias", rng.normal(0, 0.3, shape)),
                                 ("running_mean", rng.normal(0, 0.2, shape)),
                                 ("running_var", rng.uniform(0.5, 2.0, shape))):
                getattr(m, attr)[:] = mge.tensor(values.astype(np.float32))
    return model


def _without_dropout(model):
    """``model`` with dropout and drop path off (see :func:`_reorder_noise`)."""
    for m in model.modules():
        if hasattr(m, "drop_prob"):
            m.drop_prob = 0.0
    return model


def _pair(case, monkeypatch):
    """(fused model with random BNs, unfused model with its weights)."""
    fused = _without_dropout(_randomized(_build(case, True, monkeypatch)))
    plain = _without_dropout(_build(case, False, monkeypatch))
    plain.load_state_dict(fused.state_dict())
    return fused, plain


def _batch(seed=1, n=4, size=32):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 3, size, size)).astype(np.float32), rng.integers(0, 10, n).astype(np.int32)


def _rel_close(a, b, rtol, what, scale=0.0):
    """max |a - b| <= rtol * max(|b|, scale)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    err, scale = np.abs(a - b).max(), max(np.abs(b).max(), scale)
    assert err <= rtol * max(scale, 1e-30), f"{what}: max err {err:.3g} vs scale {scale:.3g}"


def _grad_scale(grads, key):
    """A bias gradient's scale: the larger of its own and its module's weight gradient. A bias that reaches a
    training-mode BN through linear ops only (a conv's bias before its BN, a BN's bias before conv -> BN) has a
    mathematically zero gradient: both models give rounding noise, on the scale of the sums that cancel."""
    if not key.endswith(".bias"):
        return 0.0
    weight = grads.get(key[:-len("bias")] + "weight")
    return 0.0 if weight is None else float(np.abs(weight).max())


def _reorder_noise(plain, x, labels, grads):
    """{parameter: max |difference|} between ``grads`` and the unfused model's gradients on the same batch in
    every rotation of the batch and its reversal: mathematically equal, so this is the reference's own float32
    noise (large where a BN normalises over few values), its largest sample. Needs dropout and drop path off
    (their masks follow the batch position)."""
    for p in plain.parameters():
        p.grad = None  # MegEngine accumulates gradients
    state = {k: np.array(v) for k, v in plain.state_dict().items()}
    noise = {k: 0.0 for k in grads}
    n = len(x)
    orders = [np.roll(np.arange(n), shift) for shift in range(1, n)] + [np.arange(n)[::-1]]
    for order in orders:  # every reordering is one sample of the noise: take the largest
        again = _repeated_step(plain, x[order], labels[order])[1]
        noise = {k: max(noise[k], float(np.abs(again[k] - grads[k]).max())) for k in grads}
    plain.load_state_dict(state)  # the running statistics of one step, as the fused model's
    return noise


def _repeated_step(model, x, labels, max_runs=5):
    """train_step's result that two runs from the same state agree on bitwise: MegEngine 1.13's CPU backward
    now and then returns a wrong (1, C, 1, 1) gradient (an SE block's excitation bias; tests/support/megengine_bug.py)."""
    state = {k: np.array(v) for k, v in model.state_dict().items()}

    def run_once():
        for p in model.parameters():
            p.grad = None  # MegEngine accumulates gradients
        model.load_state_dict(state)
        return train_step(model, x, labels)

    def agree(a, b):
        return a[0] == b[0] and all(np.array_equal(a[1][k], b[1][k]) for k in a[1])

    result = first_repeated(run_once, agree, max_runs)
    assert result is not None, f"no two of {max_runs} runs of the same step agreed (MegEngine's CPU backward)"
    return result


def _assert_same_step(fused, plain, x, labels, grad_rtol=RTOL):
    """One training step of both models: the same loss, parameter gradients and running statistics. A gradient
    may differ by ``grad_rtol`` relative (RTOL, or GRAD_RTOL's) or by 4x the reference's own reordering noise
    (:func:`_reorder_noise`),
    whichever is larger: the fused kernels sum and evaluate the activation derivative in another order."""
    got, want = _repeated_step(fused, x, labels), _repeated_step(plain, x, labels)
    noise = _reorder_noise(plain, x, labels, want[1])
    _rel_close(got[0], want[0], RTOL, "loss")
    assert got[1].keys() == want[1].keys()
    for k in want[1]:
        _rel_close(got[1][k], want[1][k], grad_rtol, f"gradient of {k}",
                   max(_grad_scale(want[1], k), 4 * noise[k] / grad_rtol))
    assert got[2].keys() == want[2].keys()
    for k in want[2]:
        _rel_close(got[2][k], want[2][k], RTOL, k)


def _eval(model, x):
    model.eval()
    return model(mge.tensor(x)).numpy()


@pytest.mark.parametrize("case", list(CASES))
def test_fused_family_equals_unfused(case, monkeypatch):
    fused, plain = _pair(case, monkeypatch)
    assert Counter(m.act for m in fused.modules() if has_act(m)) == _expected_acts(case)
    assert not [m for m in plain.modules() if has_act(m)]
    assert list(fused.state_dict()) == list(plain.state_dict())
    assert [n for n, _ in fused.named_modules()] == [n for n, _ in plain.named_modules()]

    x, labels = _batch(size=INPUT_SIZE.get(case, 32))
    _assert_same_step(fused, plain, x, labels, GRAD_RTOL.get(case, RTOL))

    # eval: the same output, and after the family's deploy folding (every BN folded into its conv)
    want_out = _eval(plain, x)
    _rel_close(_eval(fused, x), want_out, RTOL, "eval output")
    deployed = reparameterize(fused) if case == "repvgg" else fuse_conv_bn(fused, x)
    assert not [m for m in deployed.modules() if is_bn(m)]
    _rel_close(_eval(deployed, x), want_out, 1e-4, "eval output after folding")


@pytest.mark.parametrize("norm, cls", [("SyncBN", SyncBatchNormAct2d), ("FrozenBN", FrozenBatchNormAct2d)])
def test_other_bn_kinds_fuse(norm, cls, monkeypatch):
    """SyncBN (one process) and FrozenBN build their act subclasses; training step and eval as the plain ones."""
    model = _randomized(_build("regnety", True, monkeypatch, norm=norm))
    acts = [m for m in model.modules() if has_act(m)]
    assert len(acts) == sum(_expected_acts("regnety").values()) and all(type(m) is cls for m in acts)
    plain = _without_dropout(_build("regnety", False, monkeypatch, norm=norm))
    _without_dropout(model)
    plain.load_state_dict(model.state_dict())
    x, labels = _batch(seed=2)
    _assert_same_step(model, plain, x, labels)
    _rel_close(_eval(model, x), _eval(plain, x), RTOL, f"{norm} eval output")


def test_group_norm_builds_unfused(monkeypatch):
    for case in ("regnety", "mbnetv2", "snetv2", "vgg_bn", "hrnet"):
        model = _build(case, True, monkeypatch, norm="GN")
        assert not [m for m in model.modules() if has_act(m)], case
