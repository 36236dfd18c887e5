"""The fused BN -> activation ops (bn_ops.bn_act_*) against a float64 numpy transcription of
BN -> [add shortcut] -> activation and its gradient, on both backends (kernel, fallback).

The data are drawn away from the activations' kinks (|pre - k| > 1e-4 for k in 0, 6 (ReLU, ReLU6) and -3, 3
(HSwish)), where the derivative is discontinuous and float32 rounding could pick the other side than float64;
HSwish exactly at its kinks is checked against MegEngine's own F.hswish gradient. SiLU / HSwish have no
residual form (bn_ops.PRE_GRAD_ACTIVATIONS): their backward recomputes the pre-activation from x.
"""
import numpy as np
import pytest

import megengine as mge

import megengine.functional as F
from megengine.autodiff import GradManager

from basebn.ops import bn_ops, kernel_library
from tests.support.bn_act_ref import act_ref, close as _close, draw_case as _case, ref_backward, ref_pre
from tests.support.bn_ops import forced_strided_kernels

ACTS = list(bn_ops.ACTIVATIONS)


def _check(shape, act, residual, tol=1e-5, dtype=np.float32, seed=0, make=mge.tensor, count_scale=1):
    """Forward, reduce and elemt (with and without dshortcut) against the reference; ``residual`` only where the
    activation has a residual form. The backward gets y only where it reads it (ReLU, ReLU6)."""
    residual = residual and act not in bn_ops.PRE_GRAD_ACTIVATIONS
    x, s, dy, mean, invstd, w, b, pre = _case(shape, seed, dtype, residual)
    xt, st, gt = make(x), None if s is None else make(s), make(dy)
    y = bn_ops.bn_act_normalize(xt, mean, invstd, w, b, act=act, shortcut=st)
    assert y.dtype == x.dtype and tuple(y.shape) == shape
    _close(y, act_ref(pre, act), tol, "y")
    count = x.size // shape[1] * count_scale
    r1, r2, rdx, rdz = ref_backward(dy, x, mean.astype(np.float64), invstd.astype(np.float64), w, pre, act, count)
    yb = y if act in bn_ops.OUTPUT_GRAD_ACTIVATIONS else None
    s1, s2 = bn_ops.bn_act_backward_reduce(gt, yb, xt, mean, invstd, act=act, weight=w, bias=b)
    red_tol = tol * max(1.0, np.sqrt(count))
    _close(s1, r1, red_tol, "sum_dz")
    _close(s2, r2, red_tol, "sum_dz_xhat")
    dx, ds = bn_ops.bn_act_backward_elemt(gt, yb, xt, mean, invstd, w, s1, s2, count, act=act, shortcut_grad=True,
                                          bias=b)
    assert dx.dtype == dy.dtype and ds.dtype == dy.dtype
    _close(dx, rdx, tol, "dx")
    _close(ds, rdz, tol, "dshortcut")
    only_dx = bn_ops.bn_act_backward_elemt(gt, yb, xt, mean, invstd, w, s1, s2, count, act=act, bias=b)
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


RESIDUAL_ACTS = [a for a in ACTS if a not in bn_ops.PRE_GRAD_ACTIVATIONS]


@pytest.mark.parametrize("act,residual", [(a, False) for a in ACTS] + [(a, True) for a in RESIDUAL_ACTS],
                         ids=lambda v: {False: "bn_act", True: "bn_add_act"}.get(v, v))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_fused_ops_float32(backend, shape, act, residual):
    _check(shape, act, residual, seed=sum(shape))


@pytest.mark.parametrize("act", ["relu", "relu6", "silu", "hswish"])
def test_global_count_exceeds_local(backend, act):
    """SyncBN hands the backward all-reduced sums and the global count (here 3x the local one)."""
    _check((4, 3, 4, 4), act, True, count_scale=3)


@pytest.mark.parametrize("force_strided", [False, True], ids=["as_given", "gather_path"])
def test_non_contiguous(backend, force_strided):
    """Transposed views for every element-wise input (x, shortcut, dy; y is the op's own output); SiLU / HSwish
    without a shortcut."""
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


@pytest.mark.parametrize("act,off", [("relu", lambda pre: pre <= 0), ("hswish", lambda pre: pre < -3)])
def test_masked_gradient_ignores_nonfinite_dy(backend, act, off):
    """Where the derivative is 0 (ReLU off, HSwish below -3), dz is exactly 0 even for an inf dy (as autodiff's
    ReLU gradient)."""
    x, _, dy, mean, invstd, w, b, pre = _case((2, 3, 4, 5), 6, residual=False)
    assert off(pre).any()
    dy[off(pre)] = np.inf
    y = bn_ops.bn_act_normalize(mge.tensor(x), mean, invstd, w, b, act=act)
    s1, s2 = bn_ops.bn_act_backward_reduce(mge.tensor(dy), y, mge.tensor(x), mean, invstd, act=act, weight=w, bias=b)
    assert np.isfinite(s1.numpy()).all() and np.isfinite(s2.numpy()).all()


@pytest.mark.parametrize("act", ["silu", "hswish"])
def test_megengine_gradient_at_special_points(backend, act):
    """dz = act'(pre) * dy against MegEngine's own autodiff of F.silu / F.hswish, at pre exactly on HSwish's kinks
    (-3: MegEngine takes the inner slope -0.5, 3: the inner slope 1.5), 0, 6 and SiLU's saturated tails (|pre| up
    to 100, exp overflowing). mean 0, invstd 1, weight 1, bias 0 make pre == x exactly."""
    pts = np.array([-3, 3, 0, 6, -6, -1.5, 2.5, -20, 20, -88, -89, -100, 100], np.float32)
    x = np.tile(pts, (2, 1)).reshape(2, 1, pts.size, 1)
    dy = np.random.default_rng(0).standard_normal(x.shape).astype(np.float32)
    xt = mge.tensor(x)
    gm = GradManager().attach([xt])
    with gm:
        want_y = {"silu": F.silu, "hswish": F.hswish}[act](xt)
        gm.backward(want_y, mge.tensor(dy))
    zero, one = np.zeros(1, np.float32), np.ones(1, np.float32)
    y = bn_ops.bn_act_normalize(mge.tensor(x), zero, one, act=act)
    np.testing.assert_allclose(y.numpy(), want_y.numpy(), rtol=1e-6, atol=1e-30)
    # fixed statistics (eval): dx = w * invstd * dz = dz
    dz = bn_ops.bn_act_backward_elemt(mge.tensor(dy), None, mge.tensor(x), zero, one, None, zero, zero, 1.0, act=act)
    np.testing.assert_allclose(dz.numpy(), xt.grad.numpy(), rtol=1e-6, atol=1e-30)
    s1, _ = bn_ops.bn_act_backward_reduce(mge.tensor(dy), None, mge.tensor(x), zero, one, act=act)
    np.testing.assert_allclose(s1.numpy(), xt.grad.numpy().sum(dtype=np.float64), rtol=1e-5, atol=1e-6)
    if act == "hswish":
        g = dz.numpy().reshape(2, -1) / dy.reshape(2, -1)
        np.testing.assert_allclose(g[:, :2], [[-0.5, 1.5]] * 2, rtol=1e-6)


def test_bad_arguments():
    x = mge.tensor(np.zeros((2, 3, 4, 4), np.float32))
    ones = np.ones(3, np.float32)
    with pytest.raises(ValueError, match="activation"):
        bn_ops.bn_act_normalize(x, ones, ones, act="gelu")
    with pytest.raises(ValueError, match="shortcut"):
        bn_ops.bn_act_normalize(x, ones, ones, shortcut=mge.tensor(np.zeros((2, 3, 4, 5), np.float32)))
    with pytest.raises(ValueError, match="no kernel"):  # SiLU / HSwish: no residual form
        bn_ops.bn_act_normalize(x, ones, ones, act="silu", shortcut=x)
    with pytest.raises(ValueError, match="reads the forward's output"):
        bn_ops.bn_act_backward_reduce(x, None, x, ones, ones, act="relu")


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


@pytest.mark.parametrize("act", ["relu", "silu"])
def test_backward_independent_of_thread_count(monkeypatch, act):
    """The kernels' reduce sums each row in fixed lanes, then the rows of a channel in n order, and elemt is per
    element: reduce and elemt are bitwise the same with 1, 2 or 3 threads (rows spanning several 4096-element
    chunks and a tail)."""
    if not kernel_library.kernel_available():
        pytest.skip(f"BN kernels unavailable: {kernel_library.kernel_error()}")
    rng = np.random.default_rng(8)
    x, dy = (rng.standard_normal((4, 6, 71, 73)).astype(np.float32) for _ in range(2))
    mean, invstd = np.full(6, 0.1, np.float32), np.full(6, 0.9, np.float32)
    w, b = rng.uniform(0.5, 2, 6).astype(np.float32), rng.standard_normal(6).astype(np.float32)
    outs = []
    with bn_ops.use_backend("kernel"):
        y = bn_ops.bn_act_normalize(mge.tensor(x), mean, invstd, w, b, act=act)
        yb = y if act in bn_ops.OUTPUT_GRAD_ACTIVATIONS else None
        for threads in ("1", "2", "3"):
            monkeypatch.setenv("BASEBN_NUM_THREADS", threads)
            s1, s2 = bn_ops.bn_act_backward_reduce(mge.tensor(dy), yb, mge.tensor(x), mean, invstd, act=act,
                                                   weight=w, bias=b)
            dx = bn_ops.bn_act_backward_elemt(mge.tensor(dy), yb, mge.tensor(x), mean, invstd, w, s1, s2, 1000.0,
                                              act=act, bias=b)
            outs.append([t.numpy() for t in (s1, s2, dx)])
    for other in outs[1:]:
        for a, o in zip(outs[0], other):
            np.testing.assert_array_equal(a, o)
