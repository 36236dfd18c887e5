"""The fused BN -> activation ops (bn_ops.bn_act_*) against a float64 numpy transcription of
BN -> [add shortcut] -> activation and its gradient, on both backends (kernel, fallback).

The data are drawn away from the activations' kinks (|pre| and |pre - 6| > 1e-4), where the derivative
is discontinuous and float32 rounding could pick the other side than float64.
"""
import numpy as np
import pytest

import megengine as mge

from basebn.layers import bn_ops, kernel_library
from tests.support.bn_ops import forced_strided_kernels

ACTS = ["identity", "relu", "relu6"]


# ----------------------------------------------------------------------------- float64 reference
def _bs(x):
    return (1, x.shape[1]) + (1,) * (x.ndim - 2)


def _axes(x):
    return (0,) + tuple(range(2, x.ndim))


def ref_pre(x, mean, invstd, w, b, shortcut):
    """BN with the given statistics, then the residual add (float64)."""
    bs = _bs(x)
    pre = (x.astype(np.float64) - mean.reshape(bs)) * (invstd * w).reshape(bs) + b.reshape(bs)
    return pre if shortcut is None else pre + shortcut.astype(np.float64)


def ref_act(pre, act):
    return {"identity": pre, "relu": np.maximum(pre, 0.0), "relu6": np.clip(pre, 0.0, 6.0)}[act]


def ref_act_grad(pre, act):
    """d act / d pre (0 or 1 away from the kinks)."""
    return {"identity": np.ones_like(pre), "relu": (pre > 0).astype(np.float64),
            "relu6": ((pre > 0) & (pre < 6)).astype(np.float64)}[act]


def ref_backward(dy, x, mean, invstd, w, pre, act, count):
    """(sum dz, sum dz * xhat, dx, dz) with dz = act'(pre) * dy and the global ``count``."""
    dz = dy.astype(np.float64) * ref_act_grad(pre, act)
    bs = _bs(x)
    xhat = (x.astype(np.float64) - mean.reshape(bs)) * invstd.reshape(bs)
    s1, s2 = dz.sum(axis=_axes(x)), (dz * xhat).sum(axis=_axes(x))
    dx = (w * invstd).reshape(bs) * (dz - s1.reshape(bs) / count - xhat * s2.reshape(bs) / count)
    return s1, s2, dx, dz


def _close(got, want, tol, what):
    got = got.numpy() if isinstance(got, mge.Tensor) else np.asarray(got)
    scale = max(1.0, float(np.abs(want).max(initial=0.0)))
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol, atol=tol * scale, err_msg=what)


def _case(shape, seed, dtype=np.float32, residual=True):
    """x, shortcut, dy, per-channel mean/invstd/w/b (float32 values) with BN + add values spread over
    about [-8, 10] (so ReLU6 clips on both sides) and none within 1e-4 of 0 or 6."""
    rng = np.random.default_rng(seed)
    c = shape[1]
    for _ in range(50):
        x = (rng.standard_normal(shape) * 2 + 1).astype(dtype)
        shortcut = rng.standard_normal(shape).astype(dtype) if residual else None
        axes = _axes(x)
        mean = x.astype(np.float64).mean(axis=axes).astype(np.float32)
        invstd = (1.0 / np.sqrt(x.astype(np.float64).var(axis=axes) + 1e-5)).astype(np.float32)
        w = rng.uniform(2.0, 4.0, c).astype(np.float32) * rng.choice([-1, 1], c).astype(np.float32)
        b = rng.uniform(0.0, 2.0, c).astype(np.float32)
        pre = ref_pre(x, mean.astype(np.float64), invstd.astype(np.float64), w, b, shortcut)
        if np.abs(pre).min() > 1e-4 and np.abs(pre - 6).min() > 1e-4:
            dy = rng.standard_normal(shape).astype(dtype)
            return x, shortcut, dy, mean, invstd, w, b, pre
    raise AssertionError("could not draw data away from the kinks")


def _check(shape, act, residual, tol=1e-5, dtype=np.float32, seed=0, make=mge.tensor, count_scale=1):
    x, s, dy, mean, invstd, w, b, pre = _case(shape, seed, dtype, residual)
    xt, st, gt = make(x), None if s is None else make(s), make(dy)
    y = bn_ops.bn_act_normalize(xt, mean, invstd, w, b, act=act, shortcut=st)
    assert y.dtype == x.dtype and tuple(y.shape) == shape
    _close(y, ref_act(pre, act), tol, "y")
    count = x.size // shape[1] * count_scale
    r1, r2, rdx, rdz = ref_backward(dy, x, mean.astype(np.float64), invstd.astype(np.float64), w, pre, act, count)
    s1, s2 = bn_ops.bn_act_backward_reduce(gt, y, xt, mean, invstd, act=act)
    red_tol = tol * max(1.0, np.sqrt(count))
    _close(s1, r1, red_tol, "sum_dz")
    _close(s2, r2, red_tol, "sum_dz_xhat")
    dx, ds = bn_ops.bn_act_backward_elemt(gt, y, xt, mean, invstd, w, s1, s2, count, act=act, shortcut_grad=True)
    assert dx.dtype == dy.dtype and ds.dtype == dy.dtype
    _close(dx, rdx, tol, "dx")
    _close(ds, rdz, tol, "dshortcut")
    only_dx = bn_ops.bn_act_backward_elemt(gt, y, xt, mean, invstd, w, s1, s2, count, act=act)
    np.testing.assert_array_equal(only_dx.numpy(), dx.numpy())


SHAPES = [
    (8, 3),  # 2D (N, C)
    (4, 3, 7),  # 3D
    (2, 3, 5, 6),  # 4D
    (2, 3, 2, 3, 4),  # 5D
    (1, 4, 5, 5),  # N = 1
    (3, 1, 6, 6),  # C = 1
    (1, 2, 70, 70),  # S = 4900: more than one 4096-element chunk per row
]


@pytest.mark.parametrize("residual", [False, True], ids=["bn_act", "bn_add_act"])
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_fused_ops_float32(backend, shape, act, residual):
    _check(shape, act, residual, seed=sum(shape))


@pytest.mark.parametrize("act", ["relu", "relu6"])
def test_global_count_exceeds_local(backend, act):
    """SyncBN hands the backward all-reduced sums and the global count (here 3x the local one)."""
    _check((4, 3, 4, 4), act, True, count_scale=3)


@pytest.mark.parametrize("force_strided", [False, True], ids=["as_given", "gather_path"])
def test_non_contiguous(backend, force_strided):
    """Transposed views for every element-wise input (x, shortcut, dy; y is the op's own output)."""
    def transposed(a):
        return mge.tensor(np.ascontiguousarray(a.transpose(1, 0, 2, 3))).transpose(1, 0, 2, 3)

    with forced_strided_kernels(force_strided):
        for act in ACTS:
            _check((3, 4, 5, 6), act, True, make=transposed, seed=3)


@pytest.mark.parametrize("act", ACTS)
def test_float16(backend, act):
    _check((2, 3, 6, 7), act, True, tol=1e-2, dtype=np.float16, seed=11)


def test_without_affine_and_identity(backend):
    """weight/bias None mean 1/0; the identity never needs the mask."""
    x, s, dy, mean, invstd, _, _, _ = _case((2, 3, 4, 5), 5)
    ones, zeros = np.ones(3, np.float32), np.zeros(3, np.float32)
    pre = ref_pre(x, mean.astype(np.float64), invstd.astype(np.float64), ones, zeros, s)
    y = bn_ops.bn_act_normalize(mge.tensor(x), mean, invstd, act="relu", shortcut=mge.tensor(s))
    _close(y, np.maximum(pre, 0), 1e-5, "y")


def test_masked_gradient_ignores_nonfinite_dy(backend):
    """Where ReLU is off, dz is exactly 0 even for an inf dy (as autodiff's ReLU gradient)."""
    x, _, dy, mean, invstd, w, b, pre = _case((2, 3, 4, 5), 6, residual=False)
    dy[pre <= 0] = np.inf
    y = bn_ops.bn_act_normalize(mge.tensor(x), mean, invstd, w, b, act="relu")
    s1, s2 = bn_ops.bn_act_backward_reduce(mge.tensor(dy), y, mge.tensor(x), mean, invstd, act="relu")
    assert np.isfinite(s1.numpy()).all() and np.isfinite(s2.numpy()).all()


def test_bad_arguments():
    x = mge.tensor(np.zeros((2, 3, 4, 4), np.float32))
    ones = np.ones(3, np.float32)
    with pytest.raises(ValueError, match="activation"):
        bn_ops.bn_act_normalize(x, ones, ones, act="gelu")
    with pytest.raises(ValueError, match="shortcut"):
        bn_ops.bn_act_normalize(x, ones, ones, shortcut=mge.tensor(np.zeros((2, 3, 4, 5), np.float32)))


def test_kernel_matches_fallback_bitwise_for_relu_forward():
    """Both backends compute (x - mean) * scale + bias + shortcut in float32, then max(., 0)."""
    if not kernel_library.kernel_available():
        pytest.skip(f"BN kernels unavailable: {kernel_library.kernel_error()}")
    x, s, _, mean, invstd, w, b, _ = _case((2, 3, 8, 9), 7)
    outs = []
    for name in ("kernel", "fallback"):
        with bn_ops.use_backend(name):
            outs.append(bn_ops.bn_act_normalize(mge.tensor(x), mean, invstd, w, b, act="relu",
                                                shortcut=mge.tensor(s)).numpy())
    np.testing.assert_array_equal(outs[0], outs[1])
