"""The one-call local training ops (bn_ops.bn_act_train_forward / bn_act_train_backward) against a float64 numpy
transcription of batch-statistics BN -> [add shortcut] -> activation and its gradient, on both backends. On the
kernels also: their statistics, sums and outputs are bitwise those of the unfused ops (bn_stats, bn_act_normalize,
bn_act_backward_reduce, bn_act_backward_elemt) given the same invstd, and do not depend on the thread count, on
either plan: channel-major or the unfused passes in turn ($BASEBN_BN_TRAIN_PLAN forces one; by size otherwise, and
these tensors are small), and the unfused one where channel-major cannot apply (C = 8 at 3 threads; S < 32)."""
import numpy as np
import pytest

import megengine as mge

from basebn.ops import bn_ops, kernel_library
from tests.support.bn_act_ref import act_ref, close, draw_case, ref_backward, ref_pre
from tests.support.bn_ops import forced_strided_kernels

ACTS = list(bn_ops.ACTIVATIONS)
EPS = 1e-5


@pytest.fixture(autouse=True, params=["channels", "rows"])
def plan(request, monkeypatch):
    """Each test on both plans of the kernel ops (the fallback has one)."""
    monkeypatch.setenv("BASEBN_BN_TRAIN_PLAN", request.param)
    return request.param


def _axes(x):
    return (0,) + tuple(range(2, x.ndim))


def _train(shape, act, residual, seed=0, dtype=np.float32, tol=1e-5, make=mge.tensor):
    """One forward + backward vs float64; returns the tensors for further checks."""
    residual = residual and act not in bn_ops.PRE_GRAD_ACTIVATIONS
    x, s, dy, _, _, w, b, _ = draw_case(shape, seed, dtype, residual)
    x64 = x.astype(np.float64)
    mean64, var64 = x64.mean(axis=_axes(x)), x64.var(axis=_axes(x))
    invstd64 = 1.0 / np.sqrt(var64 + EPS)
    pre = ref_pre(x, mean64, invstd64, w, b, s)
    xt, st, gt = make(x), None if s is None else make(s), make(dy)
    y, mean, m2, invstd = bn_ops.bn_act_train_forward(xt, w, b, EPS, act, st)
    count = x.size // shape[1]
    assert y.dtype == x.dtype and tuple(y.shape) == shape
    close(mean, mean64, tol, "mean")
    close(m2, var64 * count, tol * np.sqrt(count), "m2")
    close(invstd, invstd64, tol, "invstd")
    close(y, act_ref(pre, act), tol, "y")
    yb = y if act in bn_ops.OUTPUT_GRAD_ACTIVATIONS else None
    dx, ds, s1, s2 = bn_ops.bn_act_train_backward(gt, yb, xt, mean, invstd, w, b, act, shortcut_grad=residual)
    r1, r2, rdx, rdz = ref_backward(dy, x, mean64, invstd64, w, pre, act, count)
    red_tol = tol * max(1.0, np.sqrt(count))
    close(s1, r1, red_tol, "sum_dz")
    close(s2, r2, red_tol, "sum_dz_xhat")
    assert dx.dtype == dy.dtype
    close(dx, rdx, tol, "dx")
    if residual:
        close(ds, rdz, tol, "dshortcut")
    else:
        assert ds is None
    return dict(x=xt, s=st, dy=gt, w=w, b=b, y=y, mean=mean, m2=m2, invstd=invstd, dx=dx, ds=ds, s1=s1, s2=s2,
                yb=yb, count=count, residual=residual)


SHAPES = [
    (16, 8, 6, 6),  # S = 36 >= 32, C = 8: the channel-major plan at 1, 2 and 4 threads
    (4, 3, 7, 7),  # C = 3: the unfused plan at 2 threads
    (8, 3),  # 2D (S = 1 < 32): the unfused plan
    (5, 4, 6),  # 3D, S = 6
    (2, 4, 70, 70),  # S = 4900: more than one 4096-element chunk per row
    (1, 4, 6, 6),  # N = 1
    (3, 1, 6, 6),  # C = 1
]


@pytest.mark.parametrize("act,residual", [(a, False) for a in ACTS] + [("relu", True), ("identity", True)],
                         ids=lambda v: {False: "bn_act", True: "bn_add_act"}.get(v, v))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_against_float64(backend, shape, act, residual):
    _train(shape, act, residual, seed=sum(shape))


@pytest.mark.parametrize("act", ACTS)
def test_float16(backend, act):
    _train((4, 6, 6, 7), act, True, seed=3, dtype=np.float16, tol=1e-2)


@pytest.mark.parametrize("force_strided", [False, True], ids=["as_given", "gather_path"])
def test_non_contiguous(backend, force_strided):
    def transposed(a):
        return mge.tensor(np.ascontiguousarray(a.transpose(1, 0, 2, 3))).transpose(1, 0, 2, 3)

    with forced_strided_kernels(force_strided):
        for act in ("relu", "silu"):
            _train((6, 4, 6, 6), act, True, seed=4, make=transposed)


@pytest.mark.parametrize("force_strided", [False, True], ids=["as_given", "gather_path"])
def test_large_transposed_inputs_and_a_broadcast_dy(backend, force_strided):
    """~100 K values: a transposed view of x with a transposed dy, then a dy broadcast over the spatial dimensions,
    through the one-call train ops against float64. MegEngine 1.13 makes such views contiguous before the ops, so
    ``gather_path`` copies contiguous tensors; the gather's strided paths: test_strided_gather.py. Identity
    activation: no kinks to keep the data away from."""
    def transposed(a):
        return mge.tensor(np.ascontiguousarray(a.transpose(1, 0, 2, 3))).transpose(1, 0, 2, 3)

    shape = (8, 12, 33, 31)  # 98 208 values; rows of 31 (not merged with their neighbours once transposed)
    rng = np.random.default_rng(6)
    x = (rng.standard_normal(shape) * 2 + 1).astype(np.float32)
    w, b = rng.uniform(0.5, 2.0, 12).astype(np.float32), rng.standard_normal(12).astype(np.float32)
    x64 = x.astype(np.float64)
    mean64, invstd64 = x64.mean(axis=(0, 2, 3)), 1.0 / np.sqrt(x64.var(axis=(0, 2, 3)) + EPS)
    pre = ref_pre(x, mean64, invstd64, w, b, None)
    count = x.size // shape[1]
    dy_full = rng.standard_normal(shape).astype(np.float32)
    dy_bcast = np.ascontiguousarray(np.broadcast_to(dy_full[:, :, :1, :1], shape))
    dy_views = ((dy_full, transposed(dy_full)),
                (dy_bcast, mge.functional.broadcast_to(mge.tensor(dy_full[:, :, :1, :1]), shape)))
    with forced_strided_kernels(force_strided):
        xt = transposed(x)
        y, mean, _, invstd = bn_ops.bn_act_train_forward(xt, w, b, EPS, "identity")
        close(y, pre, 1e-5, "y")
        close(mean, mean64, 1e-5, "mean")
        for dy, dyt in dy_views:
            dx, _, s1, s2 = bn_ops.bn_act_train_backward(dyt, None, xt, mean, invstd, w, b, "identity")
            r1, r2, rdx, _ = ref_backward(dy, x, mean64, invstd64, w, pre, "identity", count)
            close(s1, r1, 1e-5 * np.sqrt(count), "sum_dz")
            close(s2, r2, 1e-5 * np.sqrt(count), "sum_dz_xhat")
            close(dx, rdx, 1e-5, "dx")


def test_without_affine(backend):
    """weight / bias None mean 1 / 0 (the kernel op then takes a placeholder in their slots)."""
    x, _, dy, _, _, _, _, _ = draw_case((4, 4, 6, 6), 8, residual=False)
    x64 = x.astype(np.float64)
    mean64, invstd64 = x64.mean(axis=(0, 2, 3)), 1.0 / np.sqrt(x64.var(axis=(0, 2, 3)) + EPS)
    ones = np.ones(4)
    pre = ref_pre(x, mean64, invstd64, ones, np.zeros(4), None)
    y, mean, _, invstd = bn_ops.bn_act_train_forward(mge.tensor(x), act="relu")
    close(y, act_ref(pre, "relu"), 1e-5, "y")
    dx, _, s1, s2 = bn_ops.bn_act_train_backward(mge.tensor(dy), y, mge.tensor(x), mean, invstd, act="relu")
    r1, r2, rdx, _ = ref_backward(dy, x, mean64, invstd64, ones, pre, "relu", x.size // 4)
    close(dx, rdx, 1e-5, "dx")
    close(s1, r1, 1e-4, "sum_dz")


@pytest.mark.parametrize("shape,affine_shape", [((4, 4, 6, 6), (1, 4, 1, 1)), ((6, 4), (1, 4))], ids=["4d", "2d"])
def test_parameter_shaped_affine(backend, shape, affine_shape):
    """weight / bias given in a BN parameter's shape (as the layers pass them, without a reshape op): the same y
    and statistics as from (C,) vectors, against float64, and the sums (the parameters' gradients) in that shape;
    without a weight the sums stay (C,)."""
    x, _, dy, _, _, w, b, _ = draw_case(shape, 21, residual=False)
    x64 = x.astype(np.float64)
    axes = _axes(x)
    mean64, invstd64 = x64.mean(axis=axes), 1.0 / np.sqrt(x64.var(axis=axes) + EPS)
    pre = ref_pre(x, mean64, invstd64, w, b, None)
    wt, bt = (mge.tensor(np.asarray(v, np.float32).reshape(affine_shape)) for v in (w, b))
    xt, gt = mge.tensor(x), mge.tensor(dy)
    y, mean, _, invstd = bn_ops.bn_act_train_forward(xt, wt, bt, EPS, "relu")
    close(y, act_ref(pre, "relu"), 1e-5, "y")
    dx, _, s1, s2 = bn_ops.bn_act_train_backward(gt, y, xt, mean, invstd, wt, bt, "relu")
    r1, r2, rdx, _ = ref_backward(dy, x, mean64, invstd64, w, pre, "relu", x.size // shape[1])
    assert tuple(s1.shape) == affine_shape and tuple(s2.shape) == affine_shape
    close(s1.numpy().reshape(-1), r1, 1e-4, "sum_dz")
    close(s2.numpy().reshape(-1), r2, 1e-4, "sum_dz_xhat")
    close(dx, rdx, 1e-5, "dx")
    flat = bn_ops.bn_act_train_backward(gt, y, xt, mean, invstd, None, None, "relu")
    assert tuple(flat[2].shape) == (shape[1],) and tuple(flat[3].shape) == (shape[1],)


@pytest.fixture
def kernels():
    if not kernel_library.kernel_available():
        pytest.skip(f"BN kernels unavailable: {kernel_library.kernel_error()}")
    with bn_ops.use_backend("kernel"):
        yield


def _unfused(t, act):
    """What the unfused kernel ops give from the one-call op's own mean and invstd."""
    mean, m2 = bn_ops.bn_stats(t["x"])
    y = bn_ops.bn_act_normalize(t["x"], t["mean"], t["invstd"], t["w"], t["b"], act, t["s"])
    s1, s2 = bn_ops.bn_act_backward_reduce(t["dy"], t["yb"], t["x"], t["mean"], t["invstd"], act, t["w"], t["b"])
    grads = bn_ops.bn_act_backward_elemt(t["dy"], t["yb"], t["x"], t["mean"], t["invstd"], t["w"], s1, s2,
                                         t["count"], act, t["residual"], t["b"])
    dx, ds = grads if t["residual"] else (grads, None)
    return dict(mean=mean, m2=m2, y=y, s1=s1, s2=s2, dx=dx, ds=ds)


@pytest.mark.parametrize("shape", [(16, 8, 6, 6), (4, 3, 7, 7), (8, 3)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("act", ["identity", "relu", "silu"])
def test_kernel_equals_the_unfused_ops(kernels, shape, act):
    t = _train(shape, act, act != "silu", seed=5)
    for name, want in _unfused(t, act).items():
        if want is not None:
            np.testing.assert_array_equal(t[name].numpy(), want.numpy(), err_msg=name)


def test_kernel_does_not_depend_on_thread_count(kernels, monkeypatch, plan):
    """C = 8, forced channel-major: channel-major at 1, 2 and 4 threads, the unfused passes at 3 (8 < 4 * 3, not a
    multiple); and the unfused passes throughout: the same bits everywhere."""
    rng = np.random.default_rng(12)
    x = mge.tensor((rng.standard_normal((24, 8, 40, 40)) * 3 + 2).astype(np.float32))
    s = mge.tensor(rng.standard_normal((24, 8, 40, 40)).astype(np.float32))
    dy = mge.tensor(rng.standard_normal((24, 8, 40, 40)).astype(np.float32))
    w, b = rng.uniform(0.5, 2, 8).astype(np.float32), rng.standard_normal(8).astype(np.float32)
    outs = []
    for threads in ("1", "2", "3", "4"):
        monkeypatch.setenv("BASEBN_NUM_THREADS", threads)
        y, mean, m2, invstd = bn_ops.bn_act_train_forward(x, w, b, EPS, "relu", s)
        dx, ds, s1, s2 = bn_ops.bn_act_train_backward(dy, y, x, mean, invstd, w, b, "relu", shortcut_grad=True)
        outs.append([t.numpy() for t in (y, mean, m2, invstd, dx, ds, s1, s2)])
    for other in outs[1:]:
        for a, o in zip(outs[0], other):
            np.testing.assert_array_equal(a, o)


def test_bad_arguments():
    x = mge.tensor(np.zeros((2, 3, 4, 4), np.float32))
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        bn_ops.bn_act_train_forward(mge.tensor(np.zeros((1, 3), np.float32)))
    with pytest.raises(ValueError, match="activation"):
        bn_ops.bn_act_train_forward(x, act="gelu")
    with pytest.raises(ValueError, match="no kernel"):
        bn_ops.bn_act_train_forward(x, act="silu", shortcut=x)
    with pytest.raises(ValueError, match="reads the forward's output"):
        bn_ops.bn_act_train_backward(x, None, x, np.zeros(3), np.ones(3), act="relu")
