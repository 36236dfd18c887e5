"""BN in training (docs/bn_training.md) against float64 numpy written from the definitions: the non-finite guard,
accumulate_bn_stats (pooled = one forward of the concatenated batch), ghost BN (norm_batch_size: groups of
consecutive samples, running statistics moved by the groups' average mean and unbiased variance) and Batch
Renormalization (forward, backward with r and d constants, running statistics). Each numeric test runs on the
fallback ops and on the kernels when they build here."""
import numpy as np
import pytest

import megengine as mge
import megengine.module as M
from megengine.autodiff import GradManager

from basebn.layers import (BatchNorm2d, BatchRenorm2d, SyncBatchNorm, SyncBatchRenorm, accumulate_bn_stats, build_norm,
                           renorm_limits_at, set_norm_batch_size, set_renorm_limits, take_nonfinite_counts)
from basebn.ops import bn_ops, kernel_library

EPS = 1e-5
MOM = 0.9


@pytest.fixture(params=["fallback", pytest.param("kernel", marks=pytest.mark.skipif(
    "not kernel_library.kernel_available()", reason="bn_ops kernels unavailable here"))])
def bn_backend(request):
    with bn_ops.use_backend(request.param):
        yield request.param


def _rand(shape, seed, scale=1.0, shift=0.0):
    return (np.random.RandomState(seed).randn(*shape) * scale + shift).astype(np.float32)


def _c(v):
    return np.asarray(v, np.float64).reshape(1, -1, 1, 1)


def _moments(x):
    """(mean, biased var, unbiased var) per channel of (N, C, H, W), float64."""
    x = np.asarray(x, np.float64)
    n = x.shape[0] * x.shape[2] * x.shape[3]
    mean = x.mean(axis=(0, 2, 3))
    var = ((x - _c(mean)) ** 2).sum(axis=(0, 2, 3))
    return mean, var / n, var / (n - 1)


def _bn_ref(x, dy, w, b, scale=None, shift=None):
    """BN of one group with batch statistics: y, dx, dw, db; ``y = w * (scale * xhat + shift) + b`` with
    constant scale/shift (BRN's r, d; default 1, 0)."""
    x, dy = np.asarray(x, np.float64), np.asarray(dy, np.float64)
    c = x.shape[1]
    scale = np.ones(c) if scale is None else scale
    shift = np.zeros(c) if shift is None else shift
    mean, var, _ = _moments(x)
    invstd = 1.0 / np.sqrt(var + EPS)
    xhat = (x - _c(mean)) * _c(invstd)
    y = _c(w) * (_c(scale) * xhat + _c(shift)) + _c(b)
    g = dy * _c(w * scale)  # dL/dxhat
    dx = _c(invstd) * (g - g.mean(axis=(0, 2, 3), keepdims=True)
                       - xhat * (g * xhat).mean(axis=(0, 2, 3), keepdims=True))
    dw = (dy * (_c(scale) * xhat + _c(shift))).sum(axis=(0, 2, 3))
    db = dy.sum(axis=(0, 2, 3))
    return y, dx, dw, db


def _set_affine(bn, w, b):
    bn.weight[...] = mge.tensor(w.reshape(1, -1, 1, 1).astype(np.float32))
    bn.bias[...] = mge.tensor(b.reshape(1, -1, 1, 1).astype(np.float32))


def _run(bn, x, dy):
    """Forward + backward of `bn` on x with upstream gradient dy: (y, dx, dw, db) as numpy."""
    xt = mge.tensor(x)
    gm = GradManager().attach([xt, bn.weight, bn.bias])
    with gm:
        y = bn(xt)
        gm.backward(y, mge.tensor(dy))
    return y.numpy(), xt.grad.numpy(), bn.weight.grad.numpy().ravel(), bn.bias.grad.numpy().ravel()


def _buffers(bn):
    return bn.running_mean.numpy().ravel().copy(), bn.running_var.numpy().ravel().copy()


# ----------------------------------------------------------------------------------------------- guard
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("make", [lambda: BatchNorm2d(3), lambda: SyncBatchNorm(3), lambda: BatchRenorm2d(3),
                                  lambda: BatchNorm2d(3, momentum=None), lambda: BatchNorm2d(3, norm_batch_size=2)])
def test_nonfinite_batch_leaves_buffers_bit_identical(bn_backend, make, bad):
    bn = make()
    bn(mge.tensor(_rand((4, 3, 3, 3), 0)))  # a finite batch first: buffers away from their init
    before = _buffers(bn)
    x = _rand((4, 3, 3, 3), 1)
    x[1, 2, 0, 1] = bad
    bn(mge.tensor(x))
    after = _buffers(bn)
    assert after[0].tobytes() == before[0].tobytes() and after[1].tobytes() == before[1].tobytes()
    model = M.Sequential(bn)
    assert take_nonfinite_counts(model) == {"0": 1}
    assert take_nonfinite_counts(model) == {}  # cleared
    bn(mge.tensor(_rand((4, 3, 3, 3), 2)))  # finite again: moves
    assert not np.array_equal(_buffers(bn)[0], before[0])


def test_guard_adds_no_state_dict_key():
    bn = BatchNorm2d(3)
    keys = sorted(bn.state_dict())
    x = _rand((2, 3, 2, 2), 0)
    x[0, 0, 0, 0] = np.nan
    bn(mge.tensor(x))
    assert sorted(bn.state_dict()) == keys == sorted(M.BatchNorm2d(3).state_dict())


# ---------------------------------------------------------------------------------------- accumulation
@pytest.mark.parametrize("make", [lambda: BatchNorm2d(3), lambda: SyncBatchNorm(3), lambda: BatchRenorm2d(3)])
def test_accumulation_equals_one_concatenated_batch(bn_backend, make):
    bn = make()
    parts = [_rand((n, 3, 4, 4), 10 + n, scale=1 + n, shift=n) for n in (3, 5, 2)]
    with accumulate_bn_stats(M.Sequential(bn)):
        outs = [bn(mge.tensor(p)).numpy() for p in parts]
        assert _buffers(bn)[0].tolist() == [0.0] * 3  # untouched inside
    mean, _, unbiased = _moments(np.concatenate(parts))
    np.testing.assert_allclose(_buffers(bn)[0], (1 - MOM) * mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_buffers(bn)[1], MOM + (1 - MOM) * unbiased, rtol=1e-5)
    if not isinstance(bn, BatchRenorm2d):  # each micro-batch normalised with its own statistics
        for p, y in zip(parts, outs):
            ref = _bn_ref(p, np.zeros_like(p), np.ones(3), np.zeros(3))[0]
            np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


def test_accumulation_of_ghost_groups_averages_every_group(bn_backend):
    bn = BatchNorm2d(2, norm_batch_size=2)
    parts = [_rand((4, 2, 3, 3), 20, shift=1.0), _rand((2, 2, 3, 3), 21, scale=3.0)]
    with accumulate_bn_stats(M.Sequential(bn)):
        for p in parts:
            bn(mge.tensor(p))
    groups = [g for p in parts for g in np.split(p, len(p) // 2)]
    mean = np.mean([_moments(g)[0] for g in groups], axis=0)
    var = np.mean([_moments(g)[2] for g in groups], axis=0)
    np.testing.assert_allclose(_buffers(bn)[0], (1 - MOM) * mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_buffers(bn)[1], MOM + (1 - MOM) * var, rtol=1e-5)


def test_accumulation_exception_updates_nothing():
    bn = BatchNorm2d(3)
    with pytest.raises(RuntimeError):
        with accumulate_bn_stats(M.Sequential(bn)):
            bn(mge.tensor(_rand((4, 3, 2, 2), 0)))
            raise RuntimeError("stop")
    assert _buffers(bn)[0].tolist() == [0.0] * 3 and _buffers(bn)[1].tolist() == [1.0] * 3
    bn(mge.tensor(_rand((4, 3, 2, 2), 0)))  # and the layer is no longer routed to the accumulator
    assert _buffers(bn)[0].tolist() != [0.0] * 3


# -------------------------------------------------------------------------------------------- ghost BN
@pytest.mark.parametrize("n, size", [(12, 4), (10, 4), (3, 4), (8, 8), (6, 1)])
def test_ghost_bn_against_per_group_numpy(bn_backend, n, size):
    """Consecutive groups of `size` samples, a last partial group of its own; forward, backward, buffers."""
    c = 3
    x = _rand((n, c, 3, 2), 1, scale=2.0, shift=0.5)
    x[size:] += 3.0  # groups really differ
    dy = _rand((n, c, 3, 2), 2)
    w, b = _rand((c,), 3), _rand((c,), 4)
    bn = BatchNorm2d(c, norm_batch_size=size)
    _set_affine(bn, w, b)
    y, dx, dw, db = _run(bn, x, dy)
    bounds = list(range(0, n, size)) + [n]
    refs = [_bn_ref(x[s:e], dy[s:e], w, b) for s, e in zip(bounds[:-1], bounds[1:])]
    np.testing.assert_allclose(y, np.concatenate([r[0] for r in refs]), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dx, np.concatenate([r[1] for r in refs]), rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(dw, sum(r[2] for r in refs), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(db, sum(r[3] for r in refs), rtol=1e-4, atol=1e-4)
    groups = [x[s:e] for s, e in zip(bounds[:-1], bounds[1:])]
    mean = np.mean([_moments(g)[0] for g in groups], axis=0)
    var = np.mean([_moments(g)[2] for g in groups], axis=0)
    np.testing.assert_allclose(_buffers(bn)[0], (1 - MOM) * mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_buffers(bn)[1], MOM + (1 - MOM) * var, rtol=1e-5)


def test_ghost_bn_eval_and_state_dict_are_batchnorm2d():
    bn, ref = BatchNorm2d(3, norm_batch_size=2), BatchNorm2d(3)
    assert sorted(bn.state_dict()) == sorted(ref.state_dict())
    bn(mge.tensor(_rand((4, 3, 2, 2), 0)))
    ref.load_state_dict(bn.state_dict())
    bn.eval(), ref.eval()
    x = mge.tensor(_rand((4, 3, 2, 2), 1))
    np.testing.assert_array_equal(bn(x).numpy(), ref(x).numpy())


def test_set_norm_batch_size_and_bad_values():
    model = M.Sequential(BatchNorm2d(2), BatchRenorm2d(2), SyncBatchNorm(2))
    assert set_norm_batch_size(model, 4) == 1 and model[0].norm_batch_size == 4
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="norm_batch_size"):
            BatchNorm2d(2, norm_batch_size=bad)


# ------------------------------------------------------------------------------------ Batch Renormalization
def _brn_ref(x, dy, w, b, rm, rv, r_max, d_max):
    mean, var, _ = _moments(x)
    sigma_b, sigma = np.sqrt(var + EPS), np.sqrt(rv + EPS)
    r = np.clip(sigma_b / sigma, 1 / r_max, r_max)
    d = np.clip((mean - rm) / sigma, -d_max, d_max)
    return _bn_ref(x, dy, w, b, r, d), r, d


@pytest.mark.parametrize("r_max, d_max", [(3.0, 5.0), (1.5, 0.5), (1.0, 0.0)])
def test_batch_renorm_against_numpy(bn_backend, r_max, d_max):
    c = 4
    x = _rand((6, c, 3, 3), 5, scale=2.5, shift=1.0)
    dy = _rand((6, c, 3, 3), 6)
    w, b = _rand((c,), 7), _rand((c,), 8)
    rm, rv = np.array([0.0, 1.0, -2.0, 0.9]), np.array([1.0, 0.1, 40.0, 6.0])  # r and d clip in some channels
    bn = BatchRenorm2d(c, r_max=r_max, d_max=d_max)
    _set_affine(bn, w, b)
    bn.running_mean[...] = mge.tensor(rm.reshape(1, c, 1, 1).astype(np.float32))
    bn.running_var[...] = mge.tensor(rv.reshape(1, c, 1, 1).astype(np.float32))
    y, dx, dw, db = _run(bn, x, dy)
    (ry, rdx, rdw, rdb), r, d = _brn_ref(x, dy, w, b, rm, rv, r_max, d_max)
    if r_max > 1:
        assert np.any(r == r_max) or np.any(r == 1 / r_max)  # the clip is exercised
    np.testing.assert_allclose(y, ry, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dx, rdx, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(dw, rdw, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(db, rdb, rtol=1e-4, atol=1e-4)
    mean, _, unbiased = _moments(x)  # running statistics exactly as BatchNorm2d's
    np.testing.assert_allclose(_buffers(bn)[0], MOM * rm + (1 - MOM) * mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_buffers(bn)[1], MOM * rv + (1 - MOM) * unbiased, rtol=1e-5)


def test_batch_renorm_plain_limits_equal_batchnorm_and_eval_is_batchnorm(bn_backend):
    x = _rand((4, 3, 3, 3), 9, shift=2.0)
    brn, bn = BatchRenorm2d(3, r_max=1.0, d_max=0.0), BatchNorm2d(3)
    brn.load_state_dict(bn.state_dict())  # the same state dict, both ways
    np.testing.assert_allclose(brn(mge.tensor(x)).numpy(), bn(mge.tensor(x)).numpy(), rtol=1e-6, atol=1e-6)
    bn.load_state_dict(brn.state_dict())
    brn.eval(), bn.eval()
    np.testing.assert_array_equal(brn(mge.tensor(x)).numpy(), bn(mge.tensor(x)).numpy())


def test_sync_batch_renorm_one_process_equals_batch_renorm():
    x = _rand((4, 3, 3, 3), 11, shift=1.0)
    a, b = BatchRenorm2d(3, r_max=2.0, d_max=1.0), SyncBatchRenorm(3, r_max=2.0, d_max=1.0)
    for m in (a, b):
        m.running_var[...] = mge.tensor(np.full((1, 3, 1, 1), 4.0, np.float32))
    np.testing.assert_allclose(a(mge.tensor(x)).numpy(), b(mge.tensor(x)).numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_buffers(a)[1], _buffers(b)[1], rtol=1e-6)


def test_renorm_limits_schedule_and_setter():
    # warm-up 1 epoch of 10 iterations, ramp 2 epochs, final (3, 5)
    assert renorm_limits_at(0, 10, 3.0, 5.0, 1, 2) == (1.0, 0.0)
    assert renorm_limits_at(9, 10, 3.0, 5.0, 1, 2) == (1.0, 0.0)
    assert renorm_limits_at(10, 10, 3.0, 5.0, 1, 2) == (1.0, 0.0)
    assert renorm_limits_at(20, 10, 3.0, 5.0, 1, 2) == pytest.approx((2.0, 2.5))
    assert renorm_limits_at(30, 10, 3.0, 5.0, 1, 2) == (3.0, 5.0)
    assert renorm_limits_at(99, 10, 3.0, 5.0, 0, 0) == (3.0, 5.0)
    model = M.Sequential(build_norm("BRN", 2), build_norm("SyncBRN", 2), build_norm("BN", 2))
    assert set_renorm_limits(model, 2.0, 1.0) == 2
    assert (model[0].r_max, model[1].d_max) == (2.0, 1.0)
    for r_max, d_max in ((0.5, 1.0), (2.0, -0.1)):
        with pytest.raises(ValueError):
            BatchRenorm2d(2, r_max=r_max, d_max=d_max)
