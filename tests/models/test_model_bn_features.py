"""Every BN feature of basebn on one representative (the smallest name) of every model family, tiny inputs.

Per family: efficient conv-BN in eval mode finds exactly the conv -> BN edges the family has
(depthwise / grouped included) and keeps outputs and every parameter gradient; deploy fusion keeps
outputs; SyncBN conversion round trip and FrozenBN conversion keep eval outputs; precise BN sets
the running mean of the BN after the input conv to the mean of its input over the batches fed;
zero-init zeroes the last norm of every residual block (families that have one); weight decay skips
every norm parameter and bias. BN statistics and affine are randomised first so every fold matters.
The whole file takes ~35 s on 2 busy cores.
"""
import copy

import numpy as np
import pytest

import megengine as mge
from megengine.autodiff import GradManager

from basebn.engine.optimizer import param_groups
from basebn.layers import (
    FrozenBatchNorm2d,
    SyncBatchNorm,
    convert_frozen_batchnorm,
    convert_sync_batchnorm,
    enable_efficient_conv_bn_eval,
    find_conv_bn_pairs,
    fuse_conv_bn,
    revert_sync_batchnorm,
    update_bn_stats,
)
from basebn.layers.norm import is_bn, is_norm
from basebn.models import MODELS, ZERO_INIT_FAMILIES, build_model, model_info
from basebn.models.repvgg import RepVGGBlock
from basebn.models.weight_init import last_norms
from basebn.models.wide_resnet import WideBasicBlock
from tests.support.megengine_bug import first_repeated

RTOL = 1e-4

# family: (smallest name, family kwargs keeping the test tiny, input size). Narrower depthwise families:
# the efficient conv-BN weight gradient on CPU loops over conv groups in Python.
REPRESENTATIVES = {
    "cifar_resnet": ("resnet20", dict(base_width=4), 8),
    "wide_resnet": ("wrn_16_8", {}, 8),
    "resnet": ("resnet18", {}, 32),
    "resnet_basecls": ("resnet18d", {}, 32),
    "regnetx": ("regnetx_002", {}, 32),
    "regnety": ("regnety_002", {}, 32),
    "mbnetv1": ("mbnetv1_x025", {}, 32),
    "mbnetv2": ("mbnetv2_x035", {}, 32),
    "mbnetv3": ("mbnetv3_small_x075", {}, 32),
    "effnet": ("effnet_b0", dict(width_mult=0.5), 32),
    "effnet_lite": ("effnet_b0_lite", dict(width_mult=0.5), 32),
    "effnetv2": ("effnetv2_b0", dict(width_mult=0.5), 32),
    "snetv2": ("snetv2_x050", {}, 32),
    "snetv2p": ("snetv2p_x075", dict(widths=[24, 48, 96, 192]), 32),
    "repvgg": ("repvgg_a0", {}, 32),
    "vgg_bn": ("vgg11_bn", dict(head_width=64), 32),  # 64-wide fcs instead of 4096: BN is in the convs
    "hrnet": ("hrnet_w18_small_v1", dict(w_stem=16, stage_channels=[[8], [8, 16], [8, 16, 32], [8, 16, 32, 64]],
                                         merge_channels=(8, 16, 32, 64), head_width=64), 32),  # narrowed
}
ZERO_INIT_FAMILIES_EXPECTED = {"cifar_resnet", "resnet", "resnet_basecls", "regnetx", "regnety", "mbnetv2", "mbnetv3",
                               "effnet", "effnet_lite", "effnetv2", "hrnet"}


def expected_conv_bn_pairs(family, model):
    """conv -> BN edges of the family, counted from its structure (not by the finder under test)."""
    bns = [m for m in model.modules() if is_bn(m)]
    if family == "wide_resnet":  # pre-activation: conv1 -> bn2 in every block, and the stem conv -> block1's bn1
        return sum(isinstance(m, WideBasicBlock) for m in model.modules()) + 1
    if family == "repvgg":  # the identity branch's BN normalises the block input, not a conv output
        return len(bns) - sum(isinstance(m, RepVGGBlock) and m.rbr_identity is not None for m in model.modules())
    return len(bns)  # every other family: each BN directly follows its own conv


def randomize_bn(model, rng):
    for m in model.modules():
        if is_bn(m):
            c = m.num_features
            shape = (1, c, 1, 1)
            m.weight[:] = mge.tensor(rng.uniform(0.5, 1.5, shape).astype(np.float32))
            m.bias[:] = mge.tensor(rng.normal(0, 0.2, shape).astype(np.float32))
            m.running_mean[:] = mge.tensor(rng.normal(0, 0.2, shape).astype(np.float32))
            m.running_var[:] = mge.tensor(rng.uniform(0.5, 2.0, shape).astype(np.float32))


def close(actual, expected, what):
    actual, expected = np.asarray(actual), np.asarray(expected)
    np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=RTOL * max(np.abs(expected).max(), 1e-6),
                               err_msg=what)


def eval_output(model, x):
    model.eval()
    return model(x).numpy()


def output_and_grads(model, x, head):
    model.eval()
    for p in model.parameters():
        p.grad = None
    gm = GradManager().attach(model.parameters())
    with gm:
        out = model(x)
        gm.backward((out * head).sum())
    grads = {name: p.grad.numpy() for name, p in model.named_parameters() if p.grad is not None}
    return out.numpy(), grads


def mismatch(run, ref):
    """None when `run` (output, grads) equals `ref` within RTOL, else what differs."""
    (out, grads), (ref_out, ref_grads) = run, ref
    if set(grads) != set(ref_grads):
        return f"gradients of {sorted(set(grads) ^ set(ref_grads))} missing on one side"
    for what, a, b in [("output", out, ref_out)] + [(f"gradient of {k}", grads[k], g) for k, g in ref_grads.items()]:
        try:
            close(a, b, what)
        except AssertionError as e:
            return str(e)
    return None


def _agree(a, b, rtol=RTOL):
    """Two plain runs agree: same keys, every array within rtol of the larger magnitude (the summation order of
    a multi-threaded CPU reduction moves the last bits; MegEngine's wrong gradients are off by far more)."""
    def near(x, y):
        return np.allclose(x, y, rtol=rtol, atol=rtol * max(np.abs(y).max(), 1e-6))
    return near(a[0], b[0]) and a[1].keys() == b[1].keys() and all(near(a[1][k], b[1][k]) for k in a[1])


def reference_run(model, x, head, max_runs=8):
    """output_and_grads of the plain model: the first result two runs agree on (to RTOL), or None
    (tests/support/megengine_bug.py; on effnet_b0 at half width 4 of 6 runs were wrong)."""
    return first_repeated(lambda: output_and_grads(model, x, head), _agree, max_runs)


def assert_same_eval_gradients(model, plain, x, head, rounds=4, attempts=3):
    """`model` gives the plain model's eval-mode output and parameter gradients. Each round takes a fresh
    reference and up to `attempts` runs of `model`: runs hit by the MegEngine bug above are redone, a real
    difference fails every round."""
    problem = "no reproducible plain reference"
    for _ in range(rounds):
        ref = reference_run(plain, x, head)
        if ref is None:
            continue
        assert set(ref[1]) == {n for n, _ in plain.named_parameters()}
        for _ in range(attempts):
            problem = mismatch(output_and_grads(model, x, head), ref)
            if problem is None:
                return
    raise AssertionError(f"{rounds} rounds of {attempts} attempts, last: {problem}")


def input_conv_bn(model, pairs):
    """A pair whose conv reads the 3-channel input image (RepVGG's stage0 has two: 3x3 and 1x1)."""
    modules = dict(model.named_modules())
    found = [p for p in pairs if modules[p[0]].in_channels == 3]
    assert found and len(found) <= 2, found
    return found[0]


def _family_case(family):
    """(model, plain copy, input, output-gradient seed, rng, input size) of the family's representative."""
    name, kwargs, size = REPRESENTATIVES[family]
    assert model_info(name)["family"] == family
    rng = np.random.default_rng(0)
    model = build_model(name, num_classes=10, **kwargs)
    randomize_bn(model, rng)
    x = mge.tensor(rng.normal(size=(2, 3, size, size)).astype(np.float32))
    head = mge.tensor(rng.normal(size=(2, 10)).astype(np.float32))
    return model, copy.deepcopy(model), x, head, rng, size


@pytest.mark.parametrize("family", list(REPRESENTATIVES))
def test_bn_features(family):
    model, plain, x, head, rng, size = _family_case(family)
    expected = eval_output(plain, x)

    # efficient conv-BN in eval mode: every edge found, same outputs (gradients: the test below)
    pairs = find_conv_bn_pairs(model, x)
    assert len(pairs) == expected_conv_bn_pairs(family, model)
    switched = enable_efficient_conv_bn_eval(model, pairs=pairs)
    assert len(switched) == len(pairs)
    close(eval_output(model, x), expected, "efficient conv-BN output")

    # deploy fusion
    fused = fuse_conv_bn(plain, pairs=pairs)
    assert not [m for m in fused.modules() if is_bn(m)] or family in ("wide_resnet", "repvgg")
    close(eval_output(fused, x), expected, "fused output")

    # SyncBN round trip, FrozenBN
    synced = convert_sync_batchnorm(copy.deepcopy(plain))
    assert all(isinstance(m, SyncBatchNorm) for m in synced.modules() if is_bn(m))
    close(eval_output(synced, x), expected, "SyncBN output")
    reverted = revert_sync_batchnorm(synced)
    assert not [m for m in reverted.modules() if isinstance(m, SyncBatchNorm)]
    close(eval_output(reverted, x), expected, "reverted SyncBN output")
    frozen = convert_frozen_batchnorm(copy.deepcopy(plain))
    assert all(isinstance(m, FrozenBatchNorm2d) for m in frozen.modules() if is_bn(m))
    close(eval_output(frozen, x), expected, "FrozenBN output")

    # precise BN: the first BN's running mean is the mean of its input over the batches fed
    conv_name, bn_name = input_conv_bn(plain, pairs)
    batches = [rng.normal(size=(2, 3, size, size)).astype(np.float32) for _ in range(3)]
    conv = dict(plain.named_modules())[conv_name]
    conv_out = np.concatenate([conv(mge.tensor(b)).numpy() for b in batches])
    summary = update_bn_stats(plain, [(b, None) for b in batches], num_samples=None, progress=False)
    assert summary["samples"] == 6 and summary["layers"] == len([m for m in plain.modules() if is_bn(m)])
    bn = dict(plain.named_modules())[bn_name]
    close(bn.running_mean.numpy().reshape(-1), conv_out.mean(axis=(0, 2, 3)), "precise BN running mean")

    # weight decay: every norm parameter and every bias in the no-decay group
    groups = param_groups(model, 1e-4)
    no_decay = {id(p) for g in groups if g["weight_decay"] == 0 for p in g["params"]}
    norm_params = {id(p) for m in model.modules() if is_norm(m) for p in m.parameters(recursive=False)}
    biases = {id(p) for n, p in model.named_parameters() if n.endswith("bias")}
    assert no_decay == norm_params | biases and norm_params


@pytest.mark.megengine_flaky
@pytest.mark.parametrize("family", list(REPRESENTATIVES))
def test_efficient_conv_bn_gradients_equal_plain(family):
    """All parameter gradients of the efficient conv-BN model equal the plain model's in eval mode.

    Deselected by `make test` (run it with `make test-flaky`): on some families MegEngine 1.13's CPU backward
    returns different (1, C, 1, 1) gradients from run to run for the PLAIN model itself, so no reference is
    reproducible in about half the runs; tests/layers/test_conv_bn.py checks the same property on ResNets.
    """
    model, plain, x, head, _, _ = _family_case(family)
    enable_efficient_conv_bn_eval(model, pairs=find_conv_bn_pairs(model, x))
    assert_same_eval_gradients(model, plain, x, head)


@pytest.fixture(scope="module")
def default_model():
    """family -> its representative built with the defaults (10 classes), built on first use and shared by the
    tests that only read it."""
    models = {}

    def get(family):
        if family not in models:
            name, kwargs, _ = REPRESENTATIVES[family]
            models[family] = build_model(name, num_classes=10, **kwargs)
        return models[family]
    return get


@pytest.mark.parametrize("family", sorted(ZERO_INIT_FAMILIES_EXPECTED))
def test_zero_init_residual(family, default_model):
    name, kwargs, _ = REPRESENTATIVES[family]
    model = build_model(name, num_classes=10, zero_init_residual=True, **kwargs)
    norms = last_norms(model)
    assert norms, "no residual block with a last norm"
    assert all(np.all(n.weight.numpy() == 0) for n in norms)
    others = [m for m in model.modules() if is_bn(m) and all(m is not n for n in norms)]
    assert all(np.all(m.weight.numpy() == 1) for m in others)
    default = default_model(family)
    zero_by_default = family in ("cifar_resnet", "resnet")  # basebn's ResNet zero-inits by default; basecls's do not
    assert all(np.all(n.weight.numpy() == 0) == zero_by_default for n in last_norms(default))


# the documented BN defaults (README "Models"): basecls's 0.9 / 1e-5 for every family (the EfficientNets and
# MobileNetV3 too, since issue Q: tests/models/test_basecls_bn_defaults.py checks them against basecls's code)
BN_DEFAULTS = (0.9, 1e-5)


@pytest.mark.parametrize("family", list(REPRESENTATIVES))
def test_constructors_fill_in_their_bn_defaults_for_none(family):
    """bn_momentum/bn_eps None reach every constructor unfiltered (MODELS, not build_model) and mean the
    family's default: norm_factory is the one place that maps None."""
    name, kwargs, _ = REPRESENTATIVES[family]
    model = MODELS[name](num_classes=10, bn_momentum=None, bn_eps=None, **kwargs)
    momentum, eps = BN_DEFAULTS
    bns = [m for m in model.modules() if is_bn(m)]
    assert bns and all(m.momentum == momentum and m.eps == eps for m in bns)


def test_zero_init_families_table_matches_the_models(default_model):
    """models.ZERO_INIT_FAMILIES (what model.zero_init_residual applies to) is exactly the families whose built
    models have residual blocks ending in a norm."""
    assert set(ZERO_INIT_FAMILIES) == ZERO_INIT_FAMILIES_EXPECTED
    for family in REPRESENTATIVES:
        assert bool(last_norms(default_model(family))) == (family in ZERO_INIT_FAMILIES), family
