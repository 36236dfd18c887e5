"""Efficient conv-BN in eval mode, FrozenBatchNorm2d and deploy fusion, against independent references.

The reference is always the plain model (a deepcopy taken before switching) run in the same mode,
and numpy for the folding formula. Tensors are tiny: MegEngine's CPU kernels are slow.
"""
import copy
import pickle

import numpy as np
import pytest

import megengine as mge
import megengine.functional as F
import megengine.module as M
from megengine.autodiff import GradManager

from basebn.layers import (
    FrozenBatchNorm2d,
    SyncBatchNorm,
    convert_frozen_batchnorm,
    convert_sync_batchnorm,
    convert_to_batchnorm,
    disable_efficient_conv_bn_eval,
    efficient_conv_bn_pairs,
    enable_efficient_conv_bn_eval,
    find_conv_bn_pairs,
    fold_conv_bn,
    fuse_conv_bn,
)
from basebn.layers.batch_norm import BatchNorm2d
from basebn.layers.conv import Conv2d as FastConv2d
from basebn.layers.conv import fast_cpu_weight_grad
from basebn.layers.norm import is_bn2d
from basebn.models import resnet20
from tests.support.megengine_bug import first_repeated
from tests.support.numpy_resnet import resnet_eval_forward_backward

TOL = 1e-5


def close(a, b, tol=TOL):
    """max |a - b| <= tol * max |b| (relative to the reference's scale)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    err, scale = np.abs(a - b).max(), np.abs(b).max()
    assert err <= tol * max(scale, 1e-30), f"max err {err:.3g} vs scale {scale:.3g}"


def randomize(model, seed=0):
    """Non-trivial BN statistics and affine (fresh BNs are the identity-ish mean 0 / var 1)."""
    rng = np.random.default_rng(seed)
    for m in model.modules():
        if is_bn2d(m):
            c = m.num_features
            vals = {
                "weight": rng.uniform(0.5, 1.5, (1, c, 1, 1)),
                "bias": rng.normal(0, 0.5, (1, c, 1, 1)),
                "running_mean": rng.normal(0, 0.5, (1, c, 1, 1)),
                "running_var": rng.uniform(0.3, 2.0, (1, c, 1, 1)),
            }
            m.load_state_dict({k: v.astype(np.float32) for k, v in vals.items() if getattr(m, k, None) is not None})
        elif isinstance(m, M.Conv2d) and m.bias is not None:
            m.bias._reset(mge.tensor(rng.normal(0, 0.5, m.bias.shape).astype(np.float32)))
    return model


def forward_backward(model, x, seed=1):
    """Output, input gradient and {param name: gradient} for loss = sum(out * r), r fixed random."""
    x = mge.tensor(x)
    params = dict(model.named_parameters())
    for p in params.values():
        p.grad = None
    gm = GradManager().attach(list(params.values()) + [x])
    with gm:
        y = model(x)
        r = mge.tensor(np.random.default_rng(seed).standard_normal(y.shape).astype(np.float32))
        gm.backward((y * r).sum())
    grads = {k: p.grad.numpy() for k, p in params.items() if p.grad is not None}
    return y.numpy(), x.grad.numpy(), grads


def _same(a, b):
    (ya, dxa, ga), (yb, dxb, gb) = a, b
    return (np.array_equal(ya, yb) and np.array_equal(dxa, dxb) and sorted(ga) == sorted(gb)
            and all(np.array_equal(ga[k], gb[k]) for k in ga))


def reference_run(model, x, seed=1, max_runs=16):
    """forward_backward of a model in eval mode: the first result that two runs give bitwise
    (tests/support/megengine_bug.py: ~1% of calls for one BN layer, 9 of 40 for ResNet-20's 21). Used for
    the checked model too: its folded convs hand their (1, C, 1, 1) scale gradients to MegEngine as well."""
    run = first_repeated(lambda: forward_backward(model, x, seed), _same, max_runs)
    if run is None:
        raise AssertionError(f"plain reference not reproducible: {max_runs} runs, all different")
    return run


def assert_same_run(a, b):
    (ya, dxa, ga), (yb, dxb, gb) = a, b
    assert sorted(ga) == sorted(gb)
    for k, u, v in [("output", ya, yb), ("x.grad", dxa, dxb)] + [(k, ga[k], gb[k]) for k in gb]:
        try:
            close(u, v)
        except AssertionError as e:
            raise AssertionError(f"{k}: {e}") from None


def state(model):
    return {k: v.numpy() if isinstance(v, mge.Tensor) else v for k, v in model.state_dict().items()}


class ConvBN(M.Module):
    def __init__(self, conv, bn):
        super().__init__()
        self.conv, self.bn = conv, bn

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


def make_conv(cls, bias, groups, dilation, stride, padding, cin=4, cout=6):
    return cls(cin, cout, 3, stride=stride, padding=padding, dilation=dilation, groups=groups, bias=bias)


X = np.random.default_rng(0).standard_normal((2, 4, 7, 7)).astype(np.float32)

CONFIGS = [  # bias, groups, dilation, stride, padding
    (False, 1, 1, 1, 1),
    (True, 1, 1, 1, 1),
    (True, 2, 1, 2, 1),
    (False, 2, 2, 1, 2),
    (True, 1, 2, 2, 0),
]


# ---------------------------------------------------------------- folding math (numpy)

@pytest.mark.parametrize("bias,groups", [(False, 1), (True, 2)])
def test_fold_matches_numpy(bias, groups):
    conv, bn = make_conv(M.Conv2d, bias, groups, 1, 1, 1), M.BatchNorm2d(6)
    randomize(ConvBN(conv, bn))
    w, b = fold_conv_bn(conv, bn)
    g, beta, mu, var = (getattr(bn, k).numpy().reshape(-1) for k in ("weight", "bias", "running_mean", "running_var"))
    s = g / np.sqrt(var + bn.eps)
    w0 = conv.weight.numpy().reshape(6, 4 // groups, 3, 3)
    b0 = conv.bias.numpy().reshape(-1) if bias else np.zeros(6, np.float32)
    close(w.reshape(6, -1), (w0 * s[:, None, None, None]).reshape(6, -1))
    close(b.reshape(-1), (b0 - mu) * s + beta)


def test_1x1_conv_bn_against_numpy():
    """conv 1x1 is a matmul: check the efficient eval output against numpy end to end."""
    conv, bn = M.Conv2d(4, 6, 1, bias=True), M.BatchNorm2d(6)
    net = randomize(ConvBN(conv, bn))
    net.eval()
    enable_efficient_conv_bn_eval(net, example_input=X)
    y = net(mge.tensor(X)).numpy()
    w, cb = conv.weight.numpy().reshape(6, 4), conv.bias.numpy().reshape(1, 6, 1, 1)
    g, beta, mu, var = (getattr(bn, k).numpy() for k in ("weight", "bias", "running_mean", "running_var"))
    z = np.einsum("oc,nchw->nohw", w, X) + cb
    ref = np.maximum((z - mu) / np.sqrt(var + bn.eps) * g + beta, 0)
    close(y, ref)


# ---------------------------------------------------------------- efficient eval: values and gradients

@pytest.mark.parametrize("conv_cls", [M.Conv2d, FastConv2d], ids=["mge", "fast"])
@pytest.mark.parametrize("bias,groups,dilation,stride,padding", CONFIGS)
def test_efficient_eval_equals_plain(conv_cls, bias, groups, dilation, stride, padding):
    net = randomize(ConvBN(make_conv(conv_cls, bias, groups, dilation, stride, padding), M.BatchNorm2d(6)))
    net.eval()
    ref = copy.deepcopy(net)
    assert enable_efficient_conv_bn_eval(net, example_input=X) == [("conv", "bn")]
    # the conv now returns the BN'd result: the fused path really runs
    close(net.conv(mge.tensor(X)).numpy(), ref.bn(ref.conv(mge.tensor(X))).numpy())
    run, ref_run = forward_backward(net, X), reference_run(ref, X)
    assert_same_run(run, ref_run)
    assert {"conv.weight", "bn.weight", "bn.bias"} <= set(run[2])  # fine-tuning still learns W, gamma, beta


@pytest.mark.parametrize("fast", [True, False], ids=["recompute", "autodiff"])
@pytest.mark.parametrize("attach", [("bn.weight", "bn.bias"), ("conv.weight",), ("x",)])
def test_partial_gradients(fast, attach):
    """Only some of x / W / gamma, beta tracked (frozen layers, first layer); both backward paths."""
    net = randomize(ConvBN(make_conv(FastConv2d, True, 2, 1, 2, 1), M.BatchNorm2d(6)))
    net.eval()
    ref = copy.deepcopy(net)
    enable_efficient_conv_bn_eval(net, example_input=X)

    def grads(m):
        x = mge.tensor(X)
        params = dict(m.named_parameters(), x=x)
        tracked = [params[k] for k in attach]
        for t in tracked:
            t.grad = None
        gm = GradManager().attach(tracked)
        with gm:
            gm.backward((m(x) ** 2).sum())
        return [t.grad.numpy() for t in tracked]

    old = fast_cpu_weight_grad()
    try:
        fast_cpu_weight_grad(fast)
        got, want = grads(net), grads(ref)
        for _ in range(5):  # see reference_run: the plain eval-BN backward is occasionally wrong
            again = grads(ref)
            if all(np.array_equal(a, b) for a, b in zip(want, again)):
                break
            want = again
    finally:
        fast_cpu_weight_grad(old)
    for a, b in zip(got, want):
        close(a, b)


def test_norm_eval_finetuning():
    """Model in train mode with its BNs in eval (mmdet's norm_eval): fused, gradients equal."""
    net = randomize(ConvBN(make_conv(FastConv2d, False, 1, 1, 1, 1), M.BatchNorm2d(6)))
    ref = copy.deepcopy(net)
    enable_efficient_conv_bn_eval(net, example_input=X)
    for m in (net, ref):
        m.train()
        m.bn.eval()
    assert_same_run(reference_run(net, X), reference_run(ref, X))


def test_train_mode_unchanged():
    net = randomize(ConvBN(make_conv(FastConv2d, True, 1, 1, 1, 1), M.BatchNorm2d(6)))
    ref = copy.deepcopy(net)
    mean0 = net.bn.running_mean.numpy().copy()
    enable_efficient_conv_bn_eval(net, example_input=X)
    net.train()
    ref.train()
    assert_same_run(forward_backward(net, X), forward_backward(ref, X))  # once: each run updates the stats
    for k in ("running_mean", "running_var"):  # batch statistics were used and accumulated identically
        np.testing.assert_array_equal(getattr(net.bn, k).numpy(), getattr(ref.bn, k).numpy())
    assert not np.allclose(net.bn.running_mean.numpy(), mean0)


def test_megengine_freeze_bn():
    """BatchNorm2d(freeze=True) uses running stats with a detached affine, even in train mode."""
    net = randomize(ConvBN(make_conv(M.Conv2d, False, 1, 1, 1, 1), M.BatchNorm2d(6, freeze=True)))
    ref = copy.deepcopy(net)
    enable_efficient_conv_bn_eval(net, example_input=X)
    run, ref_run = forward_backward(net, X), reference_run(ref, X)
    assert_same_run(run, ref_run)
    assert "bn.weight" not in run[2]


# ---------------------------------------------------------------- which pairs are switched

class Branchy(M.Module):
    """Only c1 -> b1 qualifies; the others' conv outputs have a second use."""

    def __init__(self):
        super().__init__()
        self.c1, self.b1 = M.Conv2d(4, 4, 3, padding=1, bias=False), M.BatchNorm2d(4)
        self.c2, self.b2 = M.Conv2d(4, 4, 3, padding=1, bias=False), M.BatchNorm2d(4)  # residual: b2(c2) + c2
        self.c3, self.b3 = M.Conv2d(4, 4, 1, bias=False), M.BatchNorm2d(4)  # second branch: relu(c3) too
        self.c4, self.b4 = M.Conv2d(4, 4, 1, bias=False), M.BatchNorm2d(4)  # c4 output also returned
        self.c5, self.b5 = M.Conv2d(4, 4, 1, bias=False), M.BatchNorm2d(4)  # c5 used via a tensor method too

    def forward(self, x):
        y = F.relu(self.b1(self.c1(x)))
        z = self.c2(y)
        y = self.b2(z) + z
        t = self.c3(y)
        y = self.b3(t) * F.relu(t)
        u = self.c4(y)
        v = self.c5(y)
        return self.b4(u) + self.b5(v) * v.mean(), u


def test_conv_with_other_uses_left_alone():
    net = randomize(Branchy())
    net.eval()
    ref = copy.deepcopy(net)
    assert enable_efficient_conv_bn_eval(net, example_input=X) == [("c1", "b1")]
    for a, b in zip(net(mge.tensor(X)), ref(mge.tensor(X))):
        close(a.numpy(), b.numpy())


class SharedConv(M.Module):
    """The same conv called twice (weight sharing) cannot be switched; BN called twice neither."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn_a, self.bn_b = M.Conv2d(4, 4, 1), M.BatchNorm2d(4), M.BatchNorm2d(4)
        self.c2, self.bn2 = M.Conv2d(4, 4, 1), M.BatchNorm2d(4)

    def forward(self, x):
        y = self.bn_a(self.conv(x)) + self.bn_b(self.conv(x * 2))
        return self.bn2(self.c2(y)) + self.bn2(y)


def test_shared_modules_left_alone():
    net = SharedConv()
    net.eval()
    assert find_conv_bn_pairs(net, X) == []


def resnet20_with_own_weights(seed):
    """ResNet-20 whose every parameter and buffer comes from this test's own generator.

    Built plainly, the conv and fc weights come from MegEngine's global generator, which every earlier test
    advances: the checked model then depended on the test order (the defect of issue P, see below).
    """
    net = randomize(resnet20(num_classes=5), seed)
    rng = np.random.default_rng(seed + 1)
    for name, p in net.named_parameters():
        if p.ndim >= 2:  # conv and fc weights, He-normal
            fan_in = int(np.prod(p.shape[1:]))
            p._reset(mge.tensor(rng.normal(0, np.sqrt(2 / fan_in), p.shape).astype(np.float32)))
    return net


# The check once failed in the full suite order only (x.grad off by ~3%). Cause: the conv weights came from
# MegEngine's global generator, so the model depended on what ran before, and under some of those states a ReLU
# input fell within float32 rounding of 0 (8.9e-8 in the suite order): the input gradient is discontinuous there,
# and the plain MegEngine run (not the efficient one) took the other side of the kink than float64 does.
# global_seed=69 is such a state for the old test (x.grad off by 0.00425 of 0.469); the model no longer depends
# on it, the reference is float64 numpy, and the test asserts that its instance is away from every kink.
@pytest.mark.parametrize("global_seed", [None, 69])
def test_resnet20_all_pairs_values_and_grads(global_seed):
    if global_seed is not None:
        mge.random.seed(global_seed)
    net = resnet20_with_own_weights(seed=5)
    net.eval()
    ref = copy.deepcopy(net)
    x = np.random.default_rng(3).standard_normal((2, 3, 8, 8)).astype(np.float32)
    pairs = enable_efficient_conv_bn_eval(net)  # example input inferred from the first conv
    n_bn = sum(is_bn2d(m) for m in net.modules())
    assert len(pairs) == n_bn == 21
    run, plain = reference_run(net, x), reference_run(ref, x)
    dy = np.random.default_rng(1).standard_normal(run[0].shape).astype(np.float32)  # forward_backward's seed=1
    y64, dx64, kink_margin = resnet_eval_forward_backward(state(ref), x, dy)
    # ~20k ReLU inputs of O(1): the closest to 0 is typically 1e-5..1e-4; float32 errors here are ~1e-6
    assert kink_margin > 1e-5, f"ill-posed instance: a ReLU input is {kink_margin:.2g} from 0"
    for name, (y, dx, _) in (("efficient", run), ("plain", plain)):
        close(y, y64)
        close(dx, dx64)
    assert_same_run(run, plain)  # parameter gradients: efficient vs plain


# ---------------------------------------------------------------- round trip, state dict, copies

def test_enable_disable_round_trip_and_state_dict():
    net = randomize(ConvBN(make_conv(FastConv2d, True, 1, 1, 1, 1), M.BatchNorm2d(6)))
    net.eval()
    ref = copy.deepcopy(net)
    sd0, names0 = state(net), [n for n, _ in net.named_modules()]
    enable_efficient_conv_bn_eval(net, example_input=X)
    sd1 = state(net)
    assert list(sd1) == list(sd0) and all(np.array_equal(sd1[k], sd0[k]) for k in sd0)
    assert [n for n, _ in net.named_modules()] == names0
    assert efficient_conv_bn_pairs(net) == [("conv", "bn")]
    assert disable_efficient_conv_bn_eval(net) == [("conv", "bn")]
    assert efficient_conv_bn_pairs(net) == []
    assert "forward" not in vars(net.conv) and "forward" not in vars(net.bn)
    for train in (False, True):
        net.train(train)
        ref.train(train)
        assert_same_run(reference_run(net, X), reference_run(ref, X))


def test_switched_model_deepcopies_and_pickles():
    net = randomize(ConvBN(make_conv(M.Conv2d, False, 1, 1, 1, 1), M.BatchNorm2d(6)))
    net.eval()
    ref = copy.deepcopy(net)
    enable_efficient_conv_bn_eval(net, example_input=X)
    for other in (copy.deepcopy(net), pickle.loads(pickle.dumps(net))):
        assert efficient_conv_bn_pairs(other) == [("conv", "bn")]
        assert other.conv._efficient_conv_bn.bn is other.bn  # linked to its own BN, not the original's
        other.bn.running_mean._reset(mge.tensor(np.zeros((1, 6, 1, 1), np.float32)))
        close(net(mge.tensor(X)).numpy(), ref(mge.tensor(X)).numpy())  # the original is unaffected


def test_explicit_and_declared_pairs():
    class Untraceable(ConvBN):
        conv_bn_pairs = [("conv", "bn")]

        def forward(self, x):
            from megengine.traced_module.module_tracer import active_module_tracer

            if active_module_tracer() is not None:  # stands for any op traced_module cannot record
                raise NotImplementedError("untraceable op")
            return super().forward(x)

    net = randomize(Untraceable(M.Conv2d(4, 6, 3, padding=1), M.BatchNorm2d(6)))
    net.eval()
    ref = copy.deepcopy(net)
    with pytest.warns(UserWarning, match="conv_bn_pairs"):
        assert enable_efficient_conv_bn_eval(net, example_input=X) == [("conv", "bn")]
    assert_same_run(reference_run(net, X), reference_run(ref, X))
    disable_efficient_conv_bn_eval(net)
    assert enable_efficient_conv_bn_eval(net, pairs=[("conv", "bn")]) == [("conv", "bn")]
    with pytest.raises(TypeError):
        enable_efficient_conv_bn_eval(net, pairs=[("bn", "conv")])
    del Untraceable.conv_bn_pairs
    with pytest.raises(RuntimeError, match="untraceable op"):
        enable_efficient_conv_bn_eval(net, example_input=X)


# ---------------------------------------------------------------- deploy fusion

def test_fuse_conv_bn_resnet20():
    net = randomize(resnet20(num_classes=5))
    net.train()
    fused = fuse_conv_bn(net, example_input=np.zeros((1, 3, 8, 8), np.float32))
    assert not any(is_bn2d(m) for m in fused.modules())
    assert net.training and any(is_bn2d(m) for m in net.modules())  # the original is untouched
    net.eval()
    x = mge.tensor(np.random.default_rng(4).standard_normal((2, 3, 8, 8)).astype(np.float32))
    close(fused(x).numpy(), net(x).numpy())


@pytest.mark.parametrize("bias,groups,dilation,stride,padding", CONFIGS[1:3])
def test_fuse_conv_bn_configs_and_frozen(bias, groups, dilation, stride, padding):
    for bn in (M.BatchNorm2d(6), FrozenBatchNorm2d(6)):
        net = randomize(ConvBN(make_conv(FastConv2d, bias, groups, dilation, stride, padding), bn))
        net.eval()
        fused = fuse_conv_bn(net, example_input=X)
        assert isinstance(fused.bn, M.Identity) and fused.conv.bias is not None
        close(fused(mge.tensor(X)).numpy(), net(mge.tensor(X)).numpy())


# ---------------------------------------------------------------- FrozenBatchNorm2d

def test_frozen_bn_equals_eval_bn_and_numpy():
    bn = randomize(M.Sequential(M.BatchNorm2d(4)))[0]
    bn.eval()
    frozen = convert_frozen_batchnorm(bn)
    assert isinstance(frozen, FrozenBatchNorm2d)
    frozen.train()  # training mode changes nothing
    g, beta, mu, var = (getattr(bn, k).numpy() for k in ("weight", "bias", "running_mean", "running_var"))
    y = frozen(mge.tensor(X)).numpy()
    close(y, bn(mge.tensor(X)).numpy())
    close(y, (X - mu) / np.sqrt(var + 1e-5) * g + beta)


def test_frozen_bn_has_no_trainable_parameters():
    frozen = FrozenBatchNorm2d(4)
    assert list(frozen.parameters()) == []
    x = mge.tensor(X)
    gm = GradManager().attach([x])
    with gm:
        gm.backward(frozen(x).sum())
    assert x.grad is not None and frozen.weight.grad is None


def test_frozen_bn_state_dict_both_ways():
    bn = randomize(M.Sequential(M.BatchNorm2d(4)))[0]
    frozen = FrozenBatchNorm2d(4)
    sd = state(bn)
    assert list(state(frozen)) == list(sd) and all(state(frozen)[k].shape == v.shape for k, v in sd.items())
    frozen.load_state_dict(bn.state_dict())
    back = M.BatchNorm2d(4)
    back.load_state_dict(frozen.state_dict())
    for k in sd:
        np.testing.assert_array_equal(state(frozen)[k], sd[k])
        np.testing.assert_array_equal(state(back)[k], sd[k])
    # whole models: a BN checkpoint loads into the frozen model and back
    plain, frozen_net = randomize(resnet20(num_classes=5), seed=7), resnet20(num_classes=5, norm="FrozenBN")
    frozen_net.load_state_dict(plain.state_dict())
    again = resnet20(num_classes=5)
    again.load_state_dict(frozen_net.state_dict())
    for (k, v), (k2, v2) in zip(state(plain).items(), state(again).items()):
        assert k == k2
        np.testing.assert_array_equal(v, v2)


def test_convert_frozen_batchnorm_recursive_and_back():
    net = randomize(resnet20(num_classes=5))
    net.eval()
    ref = copy.deepcopy(net)
    x = mge.tensor(np.random.default_rng(5).standard_normal((2, 3, 8, 8)).astype(np.float32))
    out = convert_frozen_batchnorm(net)
    bns = [m for m in out.modules() if is_bn2d(m)]
    assert bns and all(isinstance(m, FrozenBatchNorm2d) for m in bns)
    assert list(state(out)) == list(state(ref))
    n_params = len(list(ref.parameters()))
    assert len(list(out.parameters())) == n_params - 2 * len(bns)
    close(out(x).numpy(), ref(x).numpy())
    back = convert_to_batchnorm(out)
    # basebn's, as build_norm("BN"); the fused BN-ReLU layers (bn_act) come back as such
    assert [type(m) for m in back.modules() if is_bn2d(m)] == [type(m) for m in ref.modules() if is_bn2d(m)]
    assert all(isinstance(m, BatchNorm2d) for m in back.modules() if is_bn2d(m))
    assert len(list(back.parameters())) == n_params
    close(back(x).numpy(), ref(x).numpy())


def test_efficient_with_frozen_bn():
    """conv -> FrozenBN is fused in train mode too; gradients reach x and W, none reach the FrozenBN."""
    net = randomize(ConvBN(make_conv(FastConv2d, True, 2, 1, 1, 1), FrozenBatchNorm2d(6)))
    ref = copy.deepcopy(net)
    assert enable_efficient_conv_bn_eval(net, example_input=X) == [("conv", "bn")]
    net.train()
    ref.train()
    close(net.conv(mge.tensor(X)).numpy(), ref.bn(ref.conv(mge.tensor(X))).numpy())
    run, ref_run = forward_backward(net, X), reference_run(ref, X)
    assert_same_run(run, ref_run)
    assert set(run[2]) == {"conv.weight", "conv.bias"}


def test_freezing_keeps_efficient_pairs_linked():
    net = randomize(ConvBN(make_conv(M.Conv2d, False, 1, 1, 1, 1), M.BatchNorm2d(6)))
    net.eval()
    ref = copy.deepcopy(net)
    enable_efficient_conv_bn_eval(net, example_input=X)
    convert_frozen_batchnorm(net)
    assert isinstance(net.bn, FrozenBatchNorm2d) and efficient_conv_bn_pairs(net) == [("conv", "bn")]
    close(net(mge.tensor(X)).numpy(), ref(mge.tensor(X)).numpy())


def test_sync_bn_pair():
    net = randomize(ConvBN(make_conv(FastConv2d, False, 1, 1, 1, 1), SyncBatchNorm(6)))
    net.eval()
    ref = copy.deepcopy(net)
    assert enable_efficient_conv_bn_eval(net, example_input=X) == [("conv", "bn")]
    assert_same_run(reference_run(net, X), reference_run(ref, X))


def test_replacing_a_switched_module_stays_correct():
    """A converter that swaps the BN (SyncBN conversion) or the conv after enabling must not break the model."""
    net = randomize(ConvBN(make_conv(M.Conv2d, True, 1, 1, 1, 1), M.BatchNorm2d(6)))
    net.eval()
    ref = copy.deepcopy(net)
    x = mge.tensor(X)
    enable_efficient_conv_bn_eval(net, example_input=X)
    net.bn = copy.deepcopy(ref.bn)  # a fresh, unswitched BN with the same values
    assert efficient_conv_bn_pairs(net) == []
    close(net(x).numpy(), ref(x).numpy())
    enable_efficient_conv_bn_eval(net, example_input=X)
    net.conv = copy.deepcopy(ref.conv)
    close(net(x).numpy(), ref(x).numpy())
    enable_efficient_conv_bn_eval(net, example_input=X)
    object.__setattr__(net.bn, "forward", lambda inp: M.BatchNorm2d.forward(net.bn, inp))  # another instance forward
    close(net(x).numpy(), ref(x).numpy())
    enable_efficient_conv_bn_eval(net, example_input=X)
    net = convert_sync_batchnorm(net)
    close(net(x).numpy(), ref(x).numpy())
