"""basebn's max-pool ops (pool_ops, MaxPool2d) against a float64 numpy max pool written from the math, and
against MegEngine's own F.max_pool2d and its gradient.

The gradient convention is MegEngine's (checked here against F.max_pool2d): every element equal to its
window's maximum gets that window's whole dy, so inputs are rectified and rounded to make many ties. The
values are copies and the sums have at most four terms, so the tolerances are tight: 1e-6 relative for a
pool, 1e-5 for the gradients of a whole ResNet-18 step. Skipped when the ops did not build here.
"""
import copy
import io

import numpy as np
import pytest

import megengine as mge
import megengine.functional as F
import megengine.module as M
from megengine import jit
from megengine.autodiff import GradManager

from basebn.deploy.graph import forbidden_ops, load_network
from basebn.layers import MaxPool2d
from basebn.ops import kernel_library, pool_ops
from basebn.layers import max_pool as max_pool_module
from basebn.layers.conv import fast_cpu_weight_grad
from basebn.models import build_model
from tests.support.numerics import pair, rel_err

TOL = 1e-6
pytestmark = pytest.mark.skipif(not kernel_library.conv_kernel_available(),
                                reason=f"oneDNN ops unavailable: {kernel_library.conv_kernel_error()}")


def reference(x, dy, kernel, stride, pad):
    """float64 y and dx: y[n, c, i, j] = max of x over rows [i*sh - ph, i*sh - ph + kh) and columns
    [j*sw - pw, j*sw - pw + kw) clipped to the image (padding never wins); dx[e] = sum of dy[o] over the
    windows o holding e with x[e] == y[o]."""
    (kh, kw), (sh, sw), (ph, pw) = pair(kernel), pair(stride), pair(pad)
    x, dy = np.asarray(x, np.float64), np.asarray(dy, np.float64)
    n, c, h, w = x.shape
    ho, wo = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
    y, dx = np.empty((n, c, ho, wo)), np.zeros_like(x)
    for i in range(ho):
        r0, r1 = max(i * sh - ph, 0), min(i * sh - ph + kh, h)
        for j in range(wo):
            c0, c1 = max(j * sw - pw, 0), min(j * sw - pw + kw, w)
            win = x[:, :, r0:r1, c0:c1]
            y[:, :, i, j] = win.max(axis=(2, 3))
            dx[:, :, r0:r1, c0:c1] += (win == y[:, :, i, j, None, None]) * dy[:, :, i, j, None, None]
    return y, dx


def tie_heavy(shape, rng):
    """Rectified values rounded to halves: most windows hold several equal maxima (often all zeros)."""
    return np.maximum(np.round(rng.standard_normal(shape) * 2) / 2, 0).astype(np.float32)


def out_shape(shape, kernel, stride, pad):
    return tuple(shape[:2]) + pool_ops.PoolGeometry(pair(kernel), pair(stride), pair(pad)).output_hw(shape[2:])


@pytest.fixture
def op_calls(monkeypatch):
    """Counts of the op calls max_pool.py makes (proves which path ran)."""
    calls = {"fwd": 0, "bwd": 0}
    for key, name in (("fwd", "max_pool_forward"), ("bwd", "max_pool_backward")):
        def counted(*a, _f=getattr(max_pool_module, name), _k=key, **kw):
            calls[_k] += 1
            return _f(*a, **kw)
        monkeypatch.setattr(max_pool_module, name, counted)
    return calls


def run_module(x, dy, kernel, stride, pad, transpose=False):
    """MaxPool2d (training) forward + backward of sum(y * dy); numpy y, dx. ``transpose``: x is a transposed
    view of a contiguous (N, C, W, H) tensor and dy arrives through a transpose too (both non-contiguous)."""
    pool = MaxPool2d(kernel, stride, pad)
    pool.train()
    xp = mge.Parameter(np.ascontiguousarray(x.transpose(0, 1, 3, 2)) if transpose else x)
    gm = GradManager().attach([xp])
    with gm:
        y = pool(xp.transpose(0, 1, 3, 2) if transpose else xp)
        if transpose:
            dyt = mge.tensor(np.ascontiguousarray(dy.transpose(0, 1, 3, 2))).transpose(0, 1, 3, 2)
            gm.backward((y * dyt).sum())
        else:
            gm.backward(y, mge.tensor(dy))
    dx = xp.grad.numpy()
    return y.numpy(), (dx.transpose(0, 1, 3, 2) if transpose else dx)


# (x shape, kernel, stride, padding)
CASES = {
    "3x3 s2 p1 (ResNet stem)": ((2, 3, 12, 12), 3, 2, 1),
    "2x2 s2 (VGG)": ((2, 3, 8, 8), 2, 2, 0),
    "3x3 s2 p1 odd sizes": ((2, 4, 9, 7), 3, 2, 1),
    "2x2 s2 odd sizes": ((3, 2, 7, 9), 2, 2, 0),
    "N=1 C=1": ((1, 1, 5, 6), 3, 2, 1),
    "non-square": ((2, 3, 11, 10), (3, 5), (2, 3), (1, 2)),
    "stride 1": ((2, 3, 6, 6), 3, 1, 1),
    "stride > kernel": ((2, 2, 8, 9), 2, 3, 0),
    "kernel = image": ((2, 3, 3, 3), 3, 2, 1),
}


def case_with_reference(name, seed):
    """(the case, x with ties, dy, the float64 reference's y and dx) of CASES[name]."""
    shape, kernel, stride, pad = CASES[name]
    rng = np.random.default_rng(seed)
    x = tie_heavy(shape, rng)
    dy = rng.standard_normal(out_shape(shape, kernel, stride, pad)).astype(np.float32)
    return CASES[name], x, dy, *reference(x, dy, kernel, stride, pad)


@pytest.mark.parametrize("name", list(CASES))
def test_values_and_gradient_match_float64_reference(name, op_calls):
    (shape, kernel, stride, pad), x, dy, y_ref, dx_ref = case_with_reference(name, seed=0)
    y, dx = run_module(x, dy, kernel, stride, pad)
    assert op_calls == {"fwd": 1, "bwd": 1}
    assert rel_err(y, y_ref) <= TOL
    assert rel_err(dx, dx_ref) <= TOL


@pytest.mark.parametrize("name", ["3x3 s2 p1 odd sizes", "2x2 s2 odd sizes", "non-square"])
def test_non_contiguous_input_and_gradient(name, op_calls):
    (shape, kernel, stride, pad), x, dy, y_ref, dx_ref = case_with_reference(name, seed=1)
    y, dx = run_module(x, dy, kernel, stride, pad, transpose=True)
    assert op_calls == {"fwd": 1, "bwd": 1}
    assert rel_err(y, y_ref) <= TOL and rel_err(dx, dx_ref) <= TOL


def test_broadcast_gradient(op_calls):
    """dy = F.ones_like(y) is a broadcast view (stride 0), not a contiguous tensor."""
    rng = np.random.default_rng(6)
    x = tie_heavy((2, 3, 9, 8), rng)
    xp = mge.Parameter(x)
    pool = MaxPool2d(3, 2, 1)
    gm = GradManager().attach([xp])
    with gm:
        y = pool(xp)
        gm.backward(y, F.ones_like(y))
    assert op_calls == {"fwd": 1, "bwd": 1}
    assert rel_err(xp.grad.numpy(), reference(x, np.ones(y.shape), 3, 2, 1)[1]) <= TOL


def test_padding_never_wins_and_every_tie_gets_the_gradient():
    """All -1 (padding must not give 0) and all 0 (every element of a window is a maximum)."""
    for fill in (-1.0, 0.0):
        x = np.full((1, 2, 5, 5), fill, np.float32)
        dy = np.ones((1, 2, 3, 3), np.float32)
        y, dx = run_module(x, dy, 3, 2, 1)
        y_ref, dx_ref = reference(x, dy, 3, 2, 1)
        assert np.all(y == fill) and rel_err(dx, dx_ref) <= TOL
        assert dx[0, 0, 1, 1] == 4.0 and dx[0, 0, 2, 2] == 1.0  # in four windows / in one, the maximum of each


@pytest.mark.parametrize("shape, kernel, stride, pad", [
    ((4, 8, 16, 16), 3, 2, 1), ((4, 8, 15, 13), 3, 2, 1), ((4, 8, 16, 16), 2, 2, 0), ((2, 3, 9, 9), 3, 1, 1)])
def test_gradient_matches_megengine_on_ties(shape, kernel, stride, pad, op_calls):
    """The reference of the convention: MegEngine's own max-pool gradient, on inputs full of ties."""
    rng = np.random.default_rng(2)
    x = tie_heavy(shape, rng)
    dy = rng.standard_normal(out_shape(shape, kernel, stride, pad)).astype(np.float32)
    xt = mge.tensor(x)
    gm = GradManager().attach([xt])
    with gm:
        y_mge = F.max_pool2d(xt, kernel, stride, pad)
        gm.backward(y_mge, mge.tensor(dy))
    y, dx = run_module(x, dy, kernel, stride, pad)
    assert op_calls == {"fwd": 1, "bwd": 1}
    assert rel_err(y, y_mge.numpy()) <= TOL
    assert rel_err(dx, xt.grad.numpy()) <= TOL


def test_thread_count_does_not_change_the_gradient(monkeypatch):
    """The planes are split over the threads, each summed by one: 1 and 2 threads agree to the bit."""
    rng = np.random.default_rng(3)
    x = tie_heavy((8, 16, 20, 20), rng)
    dy = rng.standard_normal((8, 16, 10, 10)).astype(np.float32)
    results = []
    for threads in ("1", "2"):
        monkeypatch.setenv("BASEBN_NUM_THREADS", threads)
        results.append(run_module(x, dy, 3, 2, 1))
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)


def test_module_is_megengine_maxpool_with_its_state():
    ours, theirs = MaxPool2d(3, stride=2, padding=1), M.MaxPool2d(3, stride=2, padding=1)
    assert isinstance(ours, M.MaxPool2d)
    assert (ours.kernel_size, ours.stride, ours.padding) == (theirs.kernel_size, theirs.stride, theirs.padding)
    assert ours.state_dict() == theirs.state_dict() == {}
    assert repr(ours) == repr(theirs)
    assert MaxPool2d(2).stride == 2  # stride defaults to the kernel size, as MegEngine's


@pytest.mark.parametrize("setup", ["eval", "fast paths off", "no gradient recorded"])
def test_paths_without_the_backward_op(setup, op_calls):
    """eval and fast_cpu_weight_grad(False) are MegEngine's max pool; no GradManager: forward op only."""
    rng = np.random.default_rng(4)
    x = tie_heavy((2, 3, 9, 9), rng)
    pool = MaxPool2d(3, 2, 1)
    pool.train(setup != "eval")
    old = fast_cpu_weight_grad()
    try:
        fast_cpu_weight_grad(setup != "fast paths off")
        y = pool(mge.tensor(x)).numpy()
    finally:
        fast_cpu_weight_grad(old)
    assert op_calls == {"fwd": int(setup == "no gradient recorded"), "bwd": 0}
    assert rel_err(y, reference(x, np.zeros((2, 3, 5, 5)), 3, 2, 1)[0]) <= TOL


@pytest.mark.parametrize("x_shape, kernel, stride, pad", [
    ((2, 3, 8, 8), 2, 2, 2),   # padding >= kernel: MegEngine's "CaffePooling" range
    ((2, 3, 2, 2), 5, 1, 1),   # kernel larger than the padded image
    ((3, 8, 8), 2, 2, 0),      # not NCHW
])
def test_bad_shapes_raise_value_errors_and_the_module_falls_back(x_shape, kernel, stride, pad, op_calls):
    x = mge.tensor(np.ones(x_shape, np.float32))
    geom = pool_ops.PoolGeometry(pair(kernel), pair(stride), pair(pad))
    with pytest.raises(ValueError, match="max_pool2d"):
        pool_ops.max_pool_forward(x, geom)
    pool = MaxPool2d(kernel, stride, pad)  # the module gives these to MegEngine's own max pool
    pool.train()
    try:
        want = F.max_pool2d(x, kernel, stride, pad).numpy()
    except Exception as exc:  # noqa: BLE001 - MegEngine refuses it: the module must too
        with pytest.raises(type(exc)):
            pool(x).numpy()
    else:
        np.testing.assert_array_equal(pool(x).numpy(), want)
    assert op_calls == {"fwd": 0, "bwd": 0}


def gradients(model, x, labels):
    """{name: gradient} of one cross-entropy step in train mode."""
    model.train()
    params = dict(model.named_parameters())
    gm = GradManager().attach(list(params.values()))
    with gm:
        loss = F.nn.cross_entropy(model(mge.tensor(x)), mge.tensor(labels))
        gm.backward(loss)
    return {k: p.grad.numpy().copy() for k, p in params.items()}


def test_resnet18_step_matches_megengine_max_pool(op_calls):
    """ResNet-18 (ImageNet stem: conv 7x7/2, BN-ReLU, max pool 3x3/2): the same gradients as with
    megengine.module.MaxPool2d in its place (same weights and batch)."""
    mge.random.seed(0)
    ours = build_model("resnet18", num_classes=10, stem="imagenet", zero_init_residual=False)
    theirs = copy.deepcopy(ours)
    theirs.maxpool = M.MaxPool2d(3, stride=2, padding=1)
    assert isinstance(ours.maxpool, MaxPool2d) and ours.state_dict().keys() == theirs.state_dict().keys()
    rng = np.random.default_rng(0)
    x, labels = rng.standard_normal((4, 3, 64, 64)).astype(np.float32), rng.integers(0, 10, 4).astype(np.int32)
    got = gradients(ours, x, labels)
    assert op_calls == {"fwd": 1, "bwd": 1}
    want = gradients(theirs, x, labels)
    assert op_calls == {"fwd": 1, "bwd": 1}
    for k in want:
        assert rel_err(got[k], want[k]) <= 1e-5, k


def test_symbolic_trace_of_training_holds_a_plain_max_pool(op_calls):
    """A jit.trace(symbolic=True) graph of a training-mode MaxPool2d, fast paths on, holds MegEngine's
    Pooling and no custom op (what the exporters and the traced training step need)."""
    pool = MaxPool2d(3, 2, 1)
    pool.train()

    @jit.trace(symbolic=True, capture_as_const=True)
    def infer(data):
        return pool(data)

    x = tie_heavy((2, 3, 9, 9), np.random.default_rng(5))
    y = infer(mge.tensor(x)).numpy()
    buf = io.BytesIO()
    infer.dump(buf, arg_names=["data"])
    network = load_network(buf.getvalue())
    assert forbidden_ops(network) == []
    assert [o.params["mode"] for o in network.all_oprs if o.type == "Pooling"] == ["MAX"]
    assert op_calls == {"fwd": 0, "bwd": 0}
    assert rel_err(y, reference(x, np.zeros((2, 3, 5, 5)), 3, 2, 1)[0]) <= TOL
