"""basebn's BatchNorm2d against float64 numpy written from the BN math, and against MegEngine's own
BatchNorm2d (state dict, checkpoints, eval outputs, running statistics).

Every numeric test runs for each bn_ops backend available ("fallback" always, "kernel" when the
custom ops build here).
"""
import numpy as np
import pytest

import megengine as mge
import megengine.module as M
from megengine.autodiff import GradManager
from megengine.jit import trace

from basebn.engine.optimizer import param_groups
from basebn.ops import bn_ops, kernel_library
from basebn.layers.batch_norm import BatchNorm2d
from basebn.layers.norm import build_norm, has_running_stats, is_bn, is_bn2d, is_sync_bn, uses_running_stats

EPS = 1e-5


def _backends():
    return [pytest.param("fallback"),
            pytest.param("kernel", marks=pytest.mark.skipif("not kernel_library.kernel_available()",
                                                             reason="bn_ops kernels unavailable here"))]


@pytest.fixture(params=_backends())
def bn_backend(request):
    with bn_ops.use_backend(request.param):
        yield request.param


# ------------------------------------------------------------------------------ reference
def _c(v):
    return np.asarray(v, np.float64).reshape(1, -1, 1, 1)


def train_ref(x, dy, w, b, eps=EPS):
    """Batch-statistics BN in float64: y, dx, dw, db, batch mean, unbiased batch variance."""
    x, dy = x.astype(np.float64), dy.astype(np.float64)
    n = x.size // x.shape[1]
    mean, var = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))
    xhat = (x - _c(mean)) / np.sqrt(_c(var) + eps)
    y = xhat * _c(w) + _c(b)
    dxhat = dy * _c(w)
    # dx from the chain rule through mean and var, written out (not the fused form the ops use)
    dvar = (dxhat * (x - _c(mean))).sum(axis=(0, 2, 3)) * -0.5 * (var + eps) ** -1.5
    dmean = -dxhat.sum(axis=(0, 2, 3)) / np.sqrt(var + eps) + dvar * -2.0 * (x - _c(mean)).mean(axis=(0, 2, 3))
    dx = dxhat / np.sqrt(_c(var) + eps) + _c(dvar) * 2.0 * (x - _c(mean)) / n + _c(dmean) / n
    return y, dx, (dy * xhat).sum(axis=(0, 2, 3)), dy.sum(axis=(0, 2, 3)), mean, var * n / (n - 1)


def close(a, b, tol=2e-5):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    np.testing.assert_allclose(a, b, rtol=0, atol=tol * max(1.0, float(np.abs(b).max())))


def _set(t, value):
    t[...] = mge.tensor(np.asarray(value, np.float32).reshape(t.shape))


def _step(bn, x, dy):
    """One forward + backward of sum(bn(x) * dy): y, dx, dweight, dbias (None without a gradient)."""
    xt = mge.tensor(x)
    params = list(bn.parameters())
    gm = GradManager().attach(params + [xt])
    with gm:
        y = bn(xt)
        gm.backward((y * mge.tensor(dy)).sum())
    grads = [None if p is None or p.grad is None else p.grad.numpy().reshape(-1) for p in (bn.weight, bn.bias)]
    for p in params:
        p.grad = None
    return (y.numpy(), xt.grad.numpy(), *grads)


def _random_bn(rng, c, **kwargs):
    bn = BatchNorm2d(c, **kwargs)
    w, b = rng.uniform(0.5, 2, c), rng.randn(c)
    _set(bn.weight, w)
    _set(bn.bias, b)
    return bn, w, b


# ------------------------------------------------------------------------------ numerics
@pytest.mark.parametrize("shape", [(4, 3, 5, 5), (2, 8, 7, 3), (1, 2, 4, 4)], ids=lambda s: "x".join(map(str, s)))
def test_train_forward_backward_and_running_stats(bn_backend, shape):
    rng = np.random.RandomState(sum(shape))
    c = shape[1]
    bn, w, b = _random_bn(rng, c, momentum=0.8)
    rm, rv = np.zeros(c), np.ones(c)
    for _ in range(2):
        x = (rng.randn(*shape) * 3 + 2).astype(np.float32)
        dy = rng.randn(*shape).astype(np.float32)
        y, dx, dw, db = _step(bn, x, dy)
        ry, rdx, rdw, rdb, mean, var = train_ref(x, dy, w, b)
        close(y, ry)
        close(dx, rdx)
        close(dw, rdw)
        close(db, rdb)
        rm, rv = 0.8 * rm + 0.2 * mean, 0.8 * rv + 0.2 * var  # MegEngine's momentum, unbiased variance
        close(bn.running_mean.numpy().reshape(-1), rm)
        close(bn.running_var.numpy().reshape(-1), rv)


@pytest.mark.parametrize("freeze", [False, True])
def test_running_statistics_forward_backward(bn_backend, freeze):
    """Eval mode, and ``freeze`` in train mode: running statistics, no update; freeze detaches the affine."""
    rng = np.random.RandomState(3)
    bn, w, b = _random_bn(rng, 4, freeze=freeze)
    rm, rv = rng.randn(4), rng.uniform(0.5, 2, 4)
    _set(bn.running_mean, rm)
    _set(bn.running_var, rv)
    if not freeze:
        bn.eval()
    x = rng.randn(3, 4, 5, 5).astype(np.float32)
    dy = rng.randn(3, 4, 5, 5).astype(np.float32)
    y, dx, dw, db = _step(bn, x, dy)
    s = _c(w / np.sqrt(rv + EPS))
    xhat = (x - _c(rm)) / np.sqrt(_c(rv) + EPS)
    close(y, (x - _c(rm)) * s + _c(b))
    close(dx, dy * s)
    if freeze:
        assert dw is None and db is None
    else:
        close(dw, (dy * xhat).sum(axis=(0, 2, 3)))
        close(db, dy.sum(axis=(0, 2, 3)))
    close(bn.running_mean.numpy().reshape(-1), rm)  # unchanged
    close(bn.running_var.numpy().reshape(-1), rv)


def test_without_affine_or_running_stats(bn_backend):
    rng = np.random.RandomState(4)
    bn = BatchNorm2d(3, affine=False, track_running_stats=False)
    assert bn.weight is None and bn.running_mean is None and not has_running_stats(bn)
    bn.eval()  # no running statistics: batch statistics in eval too
    x = (rng.randn(4, 3, 3, 3) * 2 + 1).astype(np.float32)
    dy = rng.randn(4, 3, 3, 3).astype(np.float32)
    y, dx, _, _ = _step(bn, x, dy)
    ry, rdx, *_ = train_ref(x, dy, np.ones(3), np.zeros(3))
    close(y, ry)
    close(dx, rdx)


def test_momentum_none_is_cumulative_average(bn_backend):
    rng = np.random.RandomState(5)
    bn = BatchNorm2d(3, momentum=None)
    means, variances = [], []
    for _ in range(3):
        x = (rng.randn(4, 3, 2, 2) * 2 + rng.randn()).astype(np.float32)
        _step(bn, x, np.zeros_like(x))
        *_, mean, var = train_ref(x, np.zeros_like(x), np.ones(3), np.zeros(3))
        means.append(mean)
        variances.append(var)
    close(bn.running_mean.numpy().reshape(-1), np.mean(means, axis=0))
    close(bn.running_var.numpy().reshape(-1), np.mean(variances, axis=0))
    bn.reset_running_stats()
    assert bn.num_batches_tracked == 0


# ------------------------------------------------------------------------------ MegEngine's BatchNorm2d
def test_state_dict_is_megengine_batchnorm2d():
    ours, theirs = BatchNorm2d(5), M.BatchNorm2d(5)
    a, b = ours.state_dict(), theirs.state_dict()
    assert list(a) == list(b)
    for k in a:  # MegEngine saves _BatchNorm tensors as (C,), holds them as (1, C, 1, 1)
        assert a[k].shape == b[k].shape == (5,) and a[k].dtype == b[k].dtype == np.float32
        assert getattr(ours, k).shape == getattr(theirs, k).shape == (1, 5, 1, 1)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    assert (ours.eps, ours.momentum, ours.affine, ours.freeze) == (theirs.eps, theirs.momentum, theirs.affine,
                                                                    theirs.freeze)


def test_megengine_checkpoint_loads_and_gives_its_eval_output(bn_backend):
    rng = np.random.RandomState(6)
    theirs = M.BatchNorm2d(4, momentum=0.7)
    _set(theirs.weight, rng.uniform(0.5, 2, 4))
    _set(theirs.bias, rng.randn(4))
    for _ in range(3):  # running statistics written by MegEngine's own BN
        theirs(mge.tensor((rng.randn(5, 4, 3, 3) * 2 + 1).astype(np.float32)))
    ours = BatchNorm2d(4, momentum=0.7)
    ours.load_state_dict(theirs.state_dict())
    x = (rng.randn(2, 4, 6, 6) * 2 + 1).astype(np.float32)
    theirs.eval()
    ours.eval()
    close(ours(mge.tensor(x)).numpy(), theirs(mge.tensor(x)).numpy())
    # one more training step each: the same output and running statistics as MegEngine's
    theirs.train()
    ours.train()
    close(ours(mge.tensor(x)).numpy(), theirs(mge.tensor(x)).numpy(), tol=1e-4)
    for k, v in theirs.state_dict().items():
        close(ours.state_dict()[k], v)


def test_is_a_bn_layer_everywhere():
    bn = build_norm("BN", 6, momentum=0.97, eps=1e-4)
    assert type(bn) is BatchNorm2d and isinstance(bn, M.BatchNorm2d)
    assert (bn.momentum, bn.eps) == (0.97, 1e-4)
    assert is_bn(bn) and is_bn2d(bn) and not is_sync_bn(bn) and has_running_stats(bn)
    assert not uses_running_stats(bn)
    bn.eval()
    assert uses_running_stats(bn)
    net = M.Sequential(M.Conv2d(3, 6, 3, bias=False), bn)
    no_decay, = [g["params"] for g in param_groups(net, 1e-4) if g["weight_decay"] == 0]
    assert {id(p) for p in no_decay} == {id(bn.weight), id(bn.bias)}


def test_symbolic_trace_runs_megengine_bn_with_the_same_math():
    rng = np.random.RandomState(7)
    bn = BatchNorm2d(3, momentum=0.8)
    traced = trace(lambda t: bn(t), symbolic=True)
    x = (rng.randn(4, 3, 3, 3) * 2 + 1).astype(np.float32)
    for _ in range(2):  # the first call records the graph, the second runs it
        y = traced(mge.tensor(x)).numpy()
    ry, _, _, _, mean, var = train_ref(x, np.zeros_like(x), np.ones(3), np.zeros(3))
    close(y, ry, tol=1e-4)
    close(bn.running_mean.numpy().reshape(-1), (1 - 0.8 ** 2) * mean)
    close(bn.running_var.numpy().reshape(-1), 0.8 ** 2 + (1 - 0.8 ** 2) * var)
    with pytest.raises(ValueError, match="momentum=None"):
        trace(lambda t: BatchNorm2d(3, momentum=None)(t), symbolic=True)(mge.tensor(x))


def test_errors():
    bn = BatchNorm2d(3)
    with pytest.raises(ValueError, match="4D"):
        bn(mge.tensor(np.zeros((2, 3), np.float32)))
    with pytest.raises(ValueError, match="channels"):
        bn(mge.tensor(np.zeros((2, 4, 2, 2), np.float32)))
    with pytest.raises(ValueError, match="more than 1 value"):
        bn(mge.tensor(np.zeros((1, 3, 1, 1), np.float32)))
