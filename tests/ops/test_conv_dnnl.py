"""basebn's oneDNN conv ops (through conv2d / Conv2d) against a float64 numpy reference written from the math.

Every check is a relative error max|a - b| / max|b|: 1e-5 for one conv (float32 sums of at most
a few hundred products), 1e-4 for a whole ResNet-20 SGD step against MegEngine's conv path (the
two round differently through 20 layers of BN). Skipped when the ops did not build here.
"""
import copy
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from loguru import logger

import megengine as mge
import megengine.functional as F
import megengine.optimizer as optim
from megengine.autodiff import GradManager

from basebn.layers import conv as conv_module
from basebn.ops import conv_ops
from basebn.ops import kernel_build, kernel_library
from basebn.layers.conv import Conv2d, conv2d, fast_cpu_weight_grad
from basebn.models import build_model
from tests.support import ROOT
from tests.support.numerics import pair, rel_err

TOL = 1e-5
pytestmark = pytest.mark.skipif(not kernel_library.conv_kernel_available(),
                                reason=f"oneDNN conv ops unavailable: {kernel_library.conv_kernel_error()}")


def taps(x_shape, w_shape, stride, pad, dil):
    """Per kernel tap (i, j): the slices of the padded input it meets, and the output size."""
    (sh, sw), (ph, pw), (dh, dw) = pair(stride), pair(pad), pair(dil)
    h, w = x_shape[2] + 2 * ph, x_shape[3] + 2 * pw
    kh, kw = w_shape[-2:]
    ho, wo = (h - dh * (kh - 1) - 1) // sh + 1, (w - dw * (kw - 1) - 1) // sw + 1
    out = []
    for i in range(kh):
        for j in range(kw):
            rows = slice(i * dh, i * dh + sh * (ho - 1) + 1, sh)
            cols = slice(j * dw, j * dw + sw * (wo - 1) + 1, sw)
            out.append((i, j, (slice(None), slice(None), rows, cols)))
    return out, (ho, wo), (ph, pw)


def reference(x, w, b, dy, stride, pad, dil, groups):
    """float64 y, dx, dW, db of
    y[n, o, h, w] = b[o] + sum_{c in group(o), i, j} xpad[n, c, h*s + i*d, w*s + j*d] * w[o, c, i, j]."""
    x, w, dy = (np.asarray(a, np.float64) for a in (x, w, dy))
    n, c = x.shape[:2]
    o, cg = w.shape[0], w.shape[1]
    og = o // groups
    taplist, (ho, wo), (ph, pw) = taps(x.shape, w.shape, stride, pad, dil)
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    y, dxp, dw = np.zeros((n, o, ho, wo)), np.zeros_like(xp), np.zeros_like(w)
    dy_g = dy.reshape(n, groups, og, ho, wo)
    for i, j, sl in taplist:
        win = xp[sl].reshape(n, groups, cg, ho, wo)
        wg = w[:, :, i, j].reshape(groups, og, cg)
        y += np.einsum("ngchw,goc->ngohw", win, wg).reshape(n, o, ho, wo)
        dw[:, :, i, j] = np.einsum("ngohw,ngchw->goc", dy_g, win).reshape(o, cg)
        dxp[sl] += np.einsum("ngohw,goc->ngchw", dy_g, wg).reshape(n, c, ho, wo)
    if b is not None:
        y += np.asarray(b, np.float64).reshape(1, o, 1, 1)
    dx = dxp[:, :, ph: ph + x.shape[2], pw: pw + x.shape[3]]
    return y, dx, dw, dy.sum(axis=(0, 2, 3))


@pytest.fixture
def op_calls(monkeypatch):
    """Counts of the oneDNN op calls conv.py makes (proves which path ran)."""
    calls = {"fwd": 0, "bwd-data": 0, "bwd-w": 0}
    for keys, name in ((("fwd",), "conv_forward"), (("bwd-data",), "conv_backward_data"),
                       (("bwd-w",), "conv_backward_weights"), (("bwd-data", "bwd-w"), "conv_backward")):
        def counted(*a, _f=getattr(conv_module, name), _keys=keys, **kw):
            for k in _keys:  # conv_backward: both gradients in one op
                calls[k] += 1
            return _f(*a, **kw)
        monkeypatch.setattr(conv_module, name, counted)
    return calls


# (N, C, H, W, O, kernel (kh, kw), stride, padding, dilation, groups, bias)
CASES = {
    "1x1": (2, 8, 5, 5, 16, (1, 1), 1, 0, 1, 1, False),
    "1x1 s2 bias": (2, 16, 6, 6, 32, (1, 1), 2, 0, 1, 1, True),
    "1x1 14x14, NCHW kernels": (2, 8, 14, 14, 16, (1, 1), 1, 0, 1, 1, False),
    "1x1 s2 bias, NCHW kernels": (2, 16, 16, 15, 24, (1, 1), 2, 0, 1, 1, True),
    "3x3": (2, 4, 7, 7, 6, (3, 3), 1, 1, 1, 1, True),
    "3x3 s2": (2, 4, 8, 8, 6, (3, 3), 2, 1, 1, 1, False),
    "5x5": (1, 3, 9, 9, 4, (5, 5), 1, 2, 1, 1, True),
    "7x7 s2 stem": (2, 3, 13, 13, 8, (7, 7), 2, 3, 1, 1, False),
    "dilation 2, groups 3": (1, 3, 9, 9, 3, (3, 3), 1, 2, 2, 3, True),
    "groups 2 s2": (2, 4, 8, 8, 6, (3, 3), 2, 1, 1, 2, False),
    "depthwise": (2, 16, 7, 7, 16, (3, 3), 1, 1, 1, 16, False),
    "depthwise s2 bias": (2, 8, 8, 8, 8, (3, 3), 2, 1, 1, 8, True),
    "depthwise x2 5x5": (1, 4, 6, 6, 8, (5, 5), 1, 2, 1, 4, False),
    # depthwise on basebn's NCHW kernels (conv_depthwise_cpu.h, >= 14 x 14 pixels): vector bodies, odd sizes, K, S
    "depthwise 3x3 wide": (2, 5, 9, 37, 5, (3, 3), 1, 1, 1, 5, True),
    "depthwise 3x3 no padding": (2, 5, 9, 33, 5, (3, 3), 1, 0, 1, 5, False),
    "depthwise 3x3 s2 wide, odd": (2, 4, 15, 45, 4, (3, 3), 2, 1, 1, 4, False),
    "depthwise 5x5 s2, odd": (2, 6, 17, 23, 6, (5, 5), 2, 2, 1, 6, True),
    "depthwise 5x5 on a smaller image": (2, 3, 4, 3, 3, (5, 5), 1, 2, 1, 3, False),
    "depthwise 7x7 wide": (1, 4, 12, 40, 4, (7, 7), 1, 3, 1, 4, False),
    "depthwise 7x7 s2": (2, 3, 14, 19, 3, (7, 7), 2, 3, 1, 3, True),
    "depthwise 3x3 on 1x1": (2, 4, 1, 1, 4, (3, 3), 1, 1, 1, 4, True),
    # output rows of at most 32 columns: one stencil over the whole padded plane (rows back to back)
    "depthwise 3x3 narrow, no padding": (2, 5, 14, 20, 5, (3, 3), 1, 0, 1, 5, True),
    "depthwise 5x5 narrow": (2, 3, 14, 18, 3, (5, 5), 1, 2, 1, 3, False),
    "depthwise 7x7 narrow": (1, 2, 15, 17, 2, (7, 7), 1, 3, 1, 2, True),
    "N=1 C=1": (1, 1, 5, 5, 2, (3, 3), 1, 1, 1, 1, True),
    "1x1 image": (3, 4, 1, 1, 5, (1, 1), 1, 0, 1, 1, True),
    "1x1 image 3x3 pad": (2, 4, 1, 1, 5, (3, 3), 1, 1, 1, 1, False),
    "non-square": (2, 3, 5, 9, 4, (3, 5), (1, 2), (1, 2), (2, 1), 1, True),
    "no padding, odd": (2, 2, 6, 7, 3, (3, 3), 2, 0, 1, 1, False),
}


def make_inputs(case, seed=0):
    n, c, h, w, o, (kh, kw), stride, pad, dil, groups, bias = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wd = rng.standard_normal((o, c // groups, kh, kw)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32) if bias else None
    return x, wd, b, rng


def run_case(case, x, wd, b, dy, transpose_x=False):
    """conv2d forward + backward of sum(y * dy); returns numpy y, dx, dW (dense view), db."""
    n, c, h, w, o, (kh, kw), stride, pad, dil, groups, bias = case
    wt = wd.reshape(groups, o // groups, c // groups, kh, kw) if groups > 1 else wd
    xt = mge.Parameter(np.ascontiguousarray(x.transpose(0, 1, 3, 2)) if transpose_x else x)
    wp = mge.Parameter(wt)
    bp = mge.Parameter(b.reshape(1, -1, 1, 1)) if b is not None else None
    gm = GradManager().attach([xt, wp] + ([bp] if bp is not None else []))
    with gm:
        # transpose_x: a non-contiguous x, the transposed view of a contiguous (N, C, W, H) tensor
        y = conv2d(xt.transpose(0, 1, 3, 2) if transpose_x else xt, wp, bp, stride, pad, dil, groups)
        gm.backward((y * mge.tensor(dy)).sum())
    dx = xt.grad.numpy()
    if transpose_x:
        dx = dx.transpose(0, 1, 3, 2)
    return y.numpy(), dx, wp.grad.numpy().reshape(wd.shape), (bp.grad.numpy().ravel() if bp is not None else None)


def inputs_and_output_gradient(case, seed):
    """make_inputs(case, seed) and a random dy of the convolution's output shape, drawn after them."""
    stride, pad, dil = case[6:9]
    x, wd, b, rng = make_inputs(case, seed=seed)
    ho_wo = taps(x.shape, wd.shape, stride, pad, dil)[1]
    return x, wd, b, rng, rng.standard_normal((x.shape[0], wd.shape[0]) + ho_wo).astype(np.float32)


@pytest.mark.parametrize("name", list(CASES))
def test_values_and_gradients_match_float64_reference(name, op_calls):
    case = CASES[name]
    stride, pad, dil, groups = case[6:10]
    x, wd, b, rng, dy = inputs_and_output_gradient(case, seed=0)
    y_ref, dx_ref, dw_ref, db_ref = reference(x, wd, b, dy, stride, pad, dil, groups)
    y, dx, dw, db = run_case(case, x, wd, b, dy)
    assert op_calls == {"fwd": 1, "bwd-data": 1, "bwd-w": 1}
    assert rel_err(y, y_ref) <= TOL
    assert rel_err(dx, dx_ref) <= TOL
    assert rel_err(dw, dw_ref) <= TOL
    if b is not None:
        assert rel_err(db, db_ref) <= TOL


@pytest.mark.parametrize("name", ["3x3 s2", "depthwise s2 bias", "non-square"])
def test_non_contiguous_input_and_gradient(name, op_calls):
    """x is a transposed view; dy arrives transposed too (the loss reads y through a transpose)."""
    case = CASES[name]
    stride, pad, dil, groups = case[6:10]
    x, wd, b, rng, dy = inputs_and_output_gradient(case, seed=3)
    y_ref, dx_ref, dw_ref, db_ref = reference(x, wd, b, dy, stride, pad, dil, groups)
    y, dx, dw, db = run_case(case, x, wd, b, dy, transpose_x=True)
    assert op_calls["fwd"] == 1
    for got, ref in ((y, y_ref), (dx, dx_ref), (dw, dw_ref)) + (((db, db_ref),) if b is not None else ()):
        assert rel_err(got, ref) <= TOL


def test_only_recorded_gradients_are_computed(op_calls):
    """A stem conv (input not recorded) skips the data gradient; no GradManager: forward only."""
    case = CASES["3x3"]
    x, wd, b, rng = make_inputs(case)
    wp = mge.Parameter(wd)
    gm = GradManager().attach([wp])
    with gm:
        y = conv2d(mge.tensor(x), wp, None, 1, 1)
        gm.backward(y.sum())
    assert op_calls == {"fwd": 1, "bwd-data": 0, "bwd-w": 1}
    ones = np.ones(y.shape, np.float32)
    assert rel_err(wp.grad.numpy(), reference(x, wd, None, ones, 1, 1, 1, 1)[2]) <= TOL
    conv2d(mge.tensor(x), wp, None, 1, 1)
    assert op_calls == {"fwd": 2, "bwd-data": 0, "bwd-w": 1}


@pytest.mark.parametrize("x_shape, w_shape, groups, padding, bias", [
    ((2, 1, 8, 8), (4, 3, 3, 3), 1, 1, False),       # 1-channel images into a 3-channel stem
    ((2, 4, 8, 8), (2, 2, 3, 3, 3), 2, 1, False),    # grouped weight expects 2 x 3 channels
    ((2, 3, 2, 2), (4, 3, 5, 5), 1, 0, False),       # kernel larger than the image
    ((2, 3, 8, 8), (4, 3, 3, 3), 1, 1, True),        # bias of another length
])
def test_bad_shapes_raise_as_megengine_conv_does(x_shape, w_shape, groups, padding, bias):
    """The ops' C++ checks only log in a release build and the op returns garbage (seen: a 3-channel
    ResNet on 1-channel images gave all-zero logits): each case must raise, as MegEngine's own conv does."""
    x = mge.tensor(np.ones(x_shape, np.float32))
    w = mge.tensor(np.ones(w_shape, np.float32))
    b = mge.tensor(np.ones((1, 5, 1, 1), np.float32)) if bias else None
    with pytest.raises(Exception):  # the reference: MegEngine refuses these shapes
        F.conv2d(x, w, b, padding=padding, groups=groups).numpy()
    with pytest.raises(ValueError, match="conv2d: "):
        conv_ops.conv_forward(x, w, b, conv_ops.ConvGeometry((1, 1), (padding, padding), (1, 1), groups))


def test_fast_path_off_is_plain_megengine(op_calls):
    """fast_cpu_weight_grad(False) (jit.trace, exporters) never reaches a custom op."""
    x, wd, b, rng = make_inputs(CASES["3x3"])
    old = fast_cpu_weight_grad()
    try:
        fast_cpu_weight_grad(False)
        wp = mge.Parameter(wd)
        gm = GradManager().attach([wp])
        with gm:
            y = conv2d(mge.tensor(x), wp, mge.tensor(b.reshape(1, -1, 1, 1)), 1, 1)
            gm.backward(y.sum())
    finally:
        fast_cpu_weight_grad(old)
    assert op_calls == {"fwd": 0, "bwd-data": 0, "bwd-w": 0}
    assert rel_err(y.numpy(), reference(x, wd, b, np.zeros(y.shape), 1, 1, 1, 1)[0]) <= TOL


def sgd_step(model, x, labels, threads=None):
    """One SGD (momentum, weight decay) step in train mode; returns {name: new value}."""
    model = copy.deepcopy(model)
    model.train()
    params = list(model.parameters())
    opt = optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-4)
    gm = GradManager().attach(params)
    with gm:
        logits = model(mge.tensor(x))
        loss = mge.functional.nn.cross_entropy(logits, mge.tensor(labels))
        gm.backward(loss)
    opt.step()
    return {k: v.numpy().copy() for k, v in model.named_parameters()}


@pytest.fixture(scope="module")
def resnet_and_batch():
    mge.random.seed(0)
    model = build_model("resnet20", num_classes=10, in_channels=3, zero_init_residual=False)
    rng = np.random.default_rng(0)
    return model, rng.standard_normal((4, 3, 16, 16)).astype(np.float32), rng.integers(0, 10, 4).astype(np.int32)


def test_resnet20_sgd_step_matches_megengine_path(resnet_and_batch, monkeypatch, op_calls):
    model, x, labels = resnet_and_batch
    before = {k: v.numpy().copy() for k, v in model.named_parameters()}
    ours = sgd_step(model, x, labels)
    n_convs = sum(isinstance(m, Conv2d) for m in model.modules())
    assert op_calls["fwd"] == n_convs and op_calls["bwd-w"] == n_convs and op_calls["bwd-data"] == n_convs - 1
    monkeypatch.setenv("BASEBN_CONV_BACKEND", "megengine")
    theirs = sgd_step(model, x, labels)
    assert op_calls["fwd"] == n_convs  # the second step ran on MegEngine's convs
    for k in before:  # compare the updates (new - old), not the weights they are small against
        assert rel_err(ours[k] - before[k], theirs[k] - before[k]) <= 1e-4, k


@pytest.mark.parametrize("threads", [None, "2"])
def test_training_step_is_deterministic(resnet_and_batch, monkeypatch, threads):
    if threads:
        monkeypatch.setenv("BASEBN_NUM_THREADS", threads)
    model, x, labels = resnet_and_batch
    a, b = sgd_step(model, x, labels), sgd_step(model, x, labels)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@pytest.mark.parametrize("groups, kernel", [(1, 3), (32, 3), (1, 1)])  # 1x1: the NCHW (gemm) kernels
def test_weight_gradient_op_is_bitwise_repeatable(monkeypatch, groups, kernel):
    """oneDNN 3.2 has no `deterministic` attribute: its CPU weight gradient is checked to repeat bitwise
    (2 threads: the batch reduction is split between them) on a ResNet-20 / depthwise / pointwise sized problem."""
    monkeypatch.setenv("BASEBN_NUM_THREADS", "2")
    rng = np.random.default_rng(5)
    x = mge.tensor(rng.standard_normal((32, 32, 14, 14)).astype(np.float32))
    dy = mge.tensor(rng.standard_normal((32, 32, 14, 14)).astype(np.float32))
    pad = kernel // 2
    geom = conv_ops.ConvGeometry((1, 1), (pad, pad), (1, 1), groups)
    runs = [conv_ops.conv_backward_weights(x, dy, (kernel, kernel), geom, with_bias=True) for _ in range(3)]
    for dw, db in runs[1:]:
        np.testing.assert_array_equal(dw.numpy(), runs[0][0].numpy())
        np.testing.assert_array_equal(db.numpy(), runs[0][1].numpy())


def test_backend_selection(monkeypatch):
    monkeypatch.setenv("BASEBN_CONV_BACKEND", "megengine")
    assert conv_ops.conv_backend() == "megengine"
    monkeypatch.setenv("BASEBN_CONV_BACKEND", "dnnl")
    assert conv_ops.conv_backend() == "dnnl"
    monkeypatch.setenv("BASEBN_CONV_BACKEND", "mkldnn")
    with pytest.raises(ValueError, match="BASEBN_CONV_BACKEND must be one of"):
        conv_ops.conv_backend()


def test_fallback_without_onednn_warns_once(monkeypatch, op_calls):
    """Ops missing (simulated): conv2d/Conv2d still compute the right values and gradients, one warning."""
    monkeypatch.setattr(conv_ops, "conv_kernel_available", lambda: False)
    monkeypatch.setattr(conv_ops, "conv_kernel_error", lambda: "simulated: no oneDNN")
    monkeypatch.setitem(conv_ops._warned, "fallback", False)
    messages = []
    sink = logger.add(lambda m: messages.append(str(m)), level="WARNING")
    try:
        case = CASES["groups 2 s2"]
        x, wd, b, rng = make_inputs(case)
        dy = rng.standard_normal((2, 6, 4, 4)).astype(np.float32)
        y_ref, dx_ref, dw_ref, _ = reference(x, wd, b, dy, 2, 1, 1, 2)
        for _ in range(2):
            y, dx, dw, _ = run_case(case, x, wd, b, dy)
            assert rel_err(y, y_ref) <= TOL and rel_err(dx, dx_ref) <= TOL and rel_err(dw, dw_ref) <= TOL
        monkeypatch.setenv("BASEBN_CONV_BACKEND", "dnnl")
        with pytest.raises(kernel_library.KernelUnavailableError, match="simulated: no oneDNN"):
            conv2d(mge.tensor(x), mge.tensor(wd.reshape(2, 3, 2, 3, 3)), None, 2, 1, 1, 2)
    finally:
        logger.remove(sink)
    assert op_calls == {"fwd": 0, "bwd-data": 0, "bwd-w": 0}
    assert sum("simulated: no oneDNN" in m for m in messages) == 1


PROBE = """
import numpy as np, megengine as mge
from basebn.ops import bn_ops, kernel_library
from basebn.layers.conv import conv2d
y = conv2d(mge.tensor(np.ones((1, 2, 4, 4), np.float32)), mge.tensor(np.ones((3, 2, 3, 3), np.float32)), padding=1)
print("RESULT", bn_ops.backend(), kernel_library.conv_kernel_available(), float(y.numpy()[0, 0, 1, 1]),
      kernel_library.conv_kernel_error().replace("\\n", " "))
"""


def _probe(env):
    """PROBE's RESULT fields in a fresh process with ``env``, and its stderr."""
    res = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    return [ln for ln in res.stdout.splitlines() if ln.startswith("RESULT")][-1].split(" ", 4), res.stderr


@pytest.fixture(scope="module")
def failed_onednn_build(tmp_path_factory):
    """A copy of the sources whose conv_dnnl.cpp does not compile, a fresh cache, and the first process on them: it
    tries the oneDNN build, records the failure and builds the BN-only library. Returns (its env, its RESULT fields).
    That library's build directory is the real sources' BN-only one (its key covers only the BN sources and
    headers), so the case without oneDNN loads it from there instead of building it again."""
    root = tmp_path_factory.mktemp("failed_onednn")
    src = root / "kernels"
    src.mkdir()
    for f in os.listdir(kernel_build.kernel_source_dir()):
        text = open(os.path.join(kernel_build.kernel_source_dir(), f)).read()
        (src / f).write_text(text + ("\n#error simulated oneDNN build failure\n" if f == "conv_dnnl.cpp" else ""))
    env = dict(os.environ, BASEBN_KERNEL_DIR=str(src), BASEBN_KERNEL_CACHE=str(root / "cache"), PYTHONPATH=ROOT)
    env.pop("BASEBN_ONEDNN_ROOT", None)
    return env, _probe(env)[0]


@pytest.mark.slow
def test_missing_onednn_builds_bn_only_library(failed_onednn_build, tmp_path):
    """$BASEBN_ONEDNN_ROOT at a missing directory: the BN kernels still load, the conv falls back and says why.
    The cache holds the BN-only library the failed-oneDNN case built from the same sources (without its self-check
    verdict): it is found under the same key and loaded."""
    bn_only = os.path.basename(kernel_build.kernel_build_spec(kernel_build.cuda_wanted(), onednn=None).build_dir)
    shutil.copytree(os.path.join(failed_onednn_build[0]["BASEBN_KERNEL_CACHE"], bn_only), tmp_path / "cache" / bn_only,
                    ignore=shutil.ignore_patterns("selfcheck-*", "build.flock", "lock"))
    env = dict(os.environ, BASEBN_ONEDNN_ROOT=os.path.join(ROOT, "no-such-onednn"), BASEBN_CONV_BACKEND="auto",
               PYTHONPATH=ROOT, BASEBN_KERNEL_CACHE=str(tmp_path / "cache"))
    line, stderr = _probe(env)
    assert line[1:4] == ["kernel", "False", "18.0"]  # 2 channels x 9 taps of ones
    assert "oneDNN not found" in line[4] and "no-such-onednn" in line[4]
    assert stderr.count("oneDNN conv ops unavailable") == 1


@pytest.mark.slow
def test_failed_onednn_build_keeps_bn_kernels(failed_onednn_build):
    """conv_dnnl.cpp that does not compile: the BN-only library is built, and the failure is recorded once."""
    env, first = failed_onednn_build
    for attempt in range(2):  # the second process reads the recorded failure instead of compiling again
        line = first if attempt == 0 else _probe(env)[0]
        assert line[1:4] == ["kernel", "False", "18.0"]
        assert "simulated oneDNN build failure" in line[4] and ("recorded in" in line[4]) == (attempt == 1)


# ---- conv_and_identity: a residual block's first conv adds the identity shortcut's gradient to its dx
@pytest.fixture
def added_gradients(monkeypatch):
    """The ``addend`` of each data-gradient op call (None: plain BasebnConvBwdData)."""
    seen = []
    for name in ("conv_backward_data", "conv_backward"):
        def recorded(*a, _f=getattr(conv_module, name), **kw):
            seen.append(kw.get("addend"))
            return _f(*a, **kw)
        monkeypatch.setattr(conv_module, name, recorded)
    return seen


def conv_module_for(case, wd, b):
    n, c, h, w, o, (kh, kw), stride, pad, dil, groups, bias = case
    conv = Conv2d(c, o, (kh, kw), stride=stride, padding=pad, dilation=dil, groups=groups, bias=bias)
    conv.weight = mge.Parameter(wd.reshape(groups, o // groups, c // groups, kh, kw) if groups > 1 else wd)
    if bias:
        conv.bias = mge.Parameter(b.reshape(1, -1, 1, 1))
    return conv


@pytest.mark.parametrize("name", list(CASES))  # dx in oneDNN's nChw8c (one pass), nhwc (reorder + sum) and nchw
def test_conv_and_identity_adds_the_shortcut_gradient_in_the_data_gradient_op(name, added_gradients):
    case = CASES[name]
    stride, pad, dil, groups = case[6:10]
    x, wd, b, rng, dy = inputs_and_output_gradient(case, seed=5)
    g_shortcut = rng.standard_normal(x.shape).astype(np.float32)
    conv = conv_module_for(case, wd, b)
    xp = mge.Parameter(x)
    gm = GradManager().attach([xp, conv.weight])
    with gm:
        y, shortcut = conv_module.conv_and_identity(conv, xp)
        gm.backward((y * mge.tensor(dy)).sum() + (shortcut * mge.tensor(g_shortcut)).sum())
    y_ref, dx_ref, dw_ref, _ = reference(x, wd, b, dy, stride, pad, dil, groups)
    assert len(added_gradients) == 1 and added_gradients[0] is not None  # one op, with the shortcut's gradient
    np.testing.assert_array_equal(shortcut.numpy(), x)
    assert rel_err(y.numpy(), y_ref) <= TOL
    assert rel_err(xp.grad.numpy(), dx_ref + g_shortcut) <= TOL
    assert rel_err(conv.weight.grad.numpy().reshape(wd.shape), dw_ref) <= TOL


def test_conv_and_identity_with_one_branch_unused_or_a_strided_shortcut_gradient(added_gradients):
    case = CASES["3x3"]
    x, wd, b, rng = make_inputs(case, seed=6)
    conv = conv_module_for(case, wd, b)
    g = rng.standard_normal(x.shape).astype(np.float32)
    for loss_of in (lambda y, s: (s * mge.tensor(g)).sum(),  # only the shortcut: dx = g, no data-gradient op
                    lambda y, s: (y * y).sum(),  # only the conv: the plain op
                    # the shortcut read through a transpose: its gradient arrives as a strided view
                    lambda y, s: (s.transpose(0, 1, 3, 2) * mge.tensor(g.transpose(0, 1, 3, 2))).sum() + y.sum()):
        xp = mge.Parameter(x)
        gm = GradManager().attach([xp])
        with gm:
            y, s = conv_module.conv_and_identity(conv, xp)
            gm.backward(loss_of(y, s))
        xt = mge.Parameter(x)  # MegEngine's own conv and autodiff's add: the reference
        gm = GradManager().attach([xt])
        with gm:
            yt = F.conv2d(xt, conv.weight, conv.bias, 1, 1)
            gm.backward(loss_of(yt, xt))
        assert rel_err(xp.grad.numpy(), xt.grad.numpy()) <= TOL
    assert [a is not None for a in added_gradients] == [False, True]


def test_conv_and_identity_calls_other_convs_and_hooked_convs(added_gradients):
    """A hooked conv runs its hooks (the plain module call); a non-basebn conv is called as it is."""
    case = CASES["3x3"]
    x, wd, b, rng = make_inputs(case, seed=7)
    hooked = conv_module_for(case, wd, b)
    calls = []
    hooked.register_forward_hook(lambda m, inp, out: calls.append(m))
    plain = mge.module.Conv2d(4, 6, 3, padding=1)
    for conv in (hooked, plain):
        xp = mge.Parameter(x)
        gm = GradManager().attach([xp])
        with gm:
            y, s = conv_module.conv_and_identity(conv, xp)
            gm.backward(y.sum() + s.sum())
        assert s is xp
    assert calls == [hooked] and all(a is None for a in added_gradients)


@pytest.mark.parametrize("model_name, size", [("resnet20", 16), ("resnet18", 32), ("mbnetv2_x035", 32),
                                              ("effnetv2_b0", 32), ("resnet50", 32), ("resnet18d", 32),
                                              ("regnetx_002", 32)])
def test_block_steps_equal_the_autodiff_sum(model_name, size, monkeypatch, added_gradients):
    """A training step whose identity shortcuts sum their gradients in the conv op equals the step that leaves
    the sum to autodiff, bit for bit (the same float32 additions), and the op did take the shortcuts."""
    mge.random.seed(1)
    model = build_model(model_name, num_classes=10, in_channels=3)
    rng = np.random.default_rng(1)
    x, labels = rng.standard_normal((4, 3, size, size)).astype(np.float32), rng.integers(0, 10, 4).astype(np.int32)
    mge.random.seed(2)  # the same dropout masks in both steps
    ours = sgd_step(model, x, labels)
    assert sum(a is not None for a in added_gradients) > 0
    if model_name.startswith("resnet") and not model_name.endswith("d"):  # every block, downsampling ones too
        blocks = sum(type(m).__name__ in ("BasicBlock", "Bottleneck") for m in model.modules())
        assert sum(a is not None for a in added_gradients) == blocks
    monkeypatch.setattr(conv_module, "_passes_input", lambda conv, x: False)
    count = len(added_gradients)
    mge.random.seed(2)
    theirs = sgd_step(model, x, labels)
    assert all(a is None for a in added_gradients[count:])
    for k in ours:
        np.testing.assert_array_equal(ours[k], theirs[k], err_msg=k)


def test_both_gradients_come_from_one_op_call(monkeypatch):
    """With x and w recorded, one BasebnConvBwd call computes dx, dW and db (dy reordered once inside)."""
    names = []
    run = conv_ops._run
    monkeypatch.setattr(conv_ops, "_run", lambda name, *a, **kw: (names.append(name), run(name, *a, **kw))[1])
    case = CASES["3x3"]
    x, wd, b, rng = make_inputs(case, seed=8)
    dy = rng.standard_normal((2, 6, 7, 7)).astype(np.float32)
    y, dx, dw, db = run_case(case, x, wd, b, dy)
    assert names == ["BasebnConvFwd", "BasebnConvBwd"]
    _, dx_ref, dw_ref, db_ref = reference(x, wd, b, dy, 1, 1, 1, 1)
    for got, ref in ((dx, dx_ref), (dw, dw_ref), (db, db_ref)):
        assert rel_err(got, ref) <= TOL


# Pointwise convs, each run forward and backward (x and w recorded): (C, H = W, stride)
LAYOUT_PROBE = r"""
import sys
import numpy as np
import megengine as mge
from megengine.autodiff import GradManager
from basebn.layers.conv import conv2d
for c, hw, stride in ((8, 14, 1), (8, 13, 1), (16, 16, 2), (520, 14, 1)):
    x = mge.Parameter(np.ones((2, c, hw, hw), np.float32))
    w = mge.Parameter(np.ones((4, c, 1, 1), np.float32))
    gm = GradManager().attach([x, w])
    with gm:
        gm.backward(conv2d(x, w, None, stride).sum())
    x.grad.numpy()
"""


@pytest.mark.parametrize("setting, nchw_cases", [
    (None, {(8, 14), (16, 16)}),  # 1x1, one group, no padding, >= 14 x 14 input pixels, <= 512 input channels
    ("0", set()),  # BASEBN_CONV_PLAIN_1X1=0: all blocked, as before the rule
    ("all", {(8, 14), (8, 13), (16, 16), (520, 14)}),  # every pointwise conv (bench_conv_layout.py's A/B)
])
def test_pointwise_convs_over_14x14_pixels_run_on_the_nchw_tensors(setting, nchw_cases):
    """oneDNN's own log of the executed primitives (ONEDNN_VERBOSE) shows which layout each conv ran in: the
    pointwise convs the rule names read and write NCHW (``abcd``) in all three ops, the others a blocked layout."""
    env = dict(os.environ, ONEDNN_VERBOSE="profile_exec", BASEBN_NUM_THREADS="1")
    env.pop("BASEBN_CONV_PLAIN_1X1", None)
    if setting is not None:
        env["BASEBN_CONV_PLAIN_1X1"] = setting
    proc = subprocess.run([sys.executable, "-c", LAYOUT_PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    layouts = {}
    for line in proc.stdout.splitlines():
        fields = line.split(",")
        if not line.startswith("onednn_verbose") or "exec" not in fields or "convolution" not in fields:
            continue
        for c, hw in ((8, 14), (8, 13), (16, 16), (520, 14)):
            if f"ic{c}oc4_ih{hw}oh" in line:
                memory = fields[fields.index("exec") + 5]  # src_f32::blocked:abcd::f0 wei_... dst_...
                nchw = "src_f32::blocked:abcd:" in memory and "dst_f32::blocked:abcd:" in memory
                layouts.setdefault((c, hw), []).append(nchw)
    assert sorted(layouts) == [(8, 13), (8, 14), (16, 16), (520, 14)], proc.stdout[-2000:]
    for case, nchw in layouts.items():
        assert len(nchw) == 3, (case, nchw)  # forward, data gradient, weight gradient
        assert nchw == [case in nchw_cases] * 3, (case, nchw)



# Depthwise convs, each run forward and backward (x and w recorded): (C, O, kernel, dilation, H = W)
DEPTHWISE_PROBE = r"""
import numpy as np
import megengine as mge
from megengine.autodiff import GradManager
from basebn.layers.conv import conv2d
for c, o, k, dil, hw in ((8, 8, 3, 1, 14), (8, 16, 3, 1, 14), (6, 6, 3, 2, 14), (10, 10, 5, 1, 15), (12, 12, 3, 1, 13)):
    x = mge.Parameter(np.ones((2, c, hw, hw), np.float32))
    w = mge.Parameter(np.ones((c, o // c, 1, k, k), np.float32))
    gm = GradManager().attach([x, w])
    with gm:
        gm.backward(conv2d(x, w, None, 1, dil * (k // 2), dil, c).sum())
    x.grad.numpy()
"""


@pytest.mark.parametrize("setting, own_kernels", [(None, {8, 10}), ("0", set())])
def test_depthwise_convs_over_14x14_pixels_run_on_basebns_kernels(setting, own_kernels):
    """oneDNN's log of executed primitives (ONEDNN_VERBOSE) has no convolution for the depthwise convs that
    conv_depthwise_cpu.h takes (3x3 and 5x5, no dilation, >= 14 x 14 pixels), and the forward, data- and
    weight-gradient primitives for a channel multiplier of 2, a dilated conv, a 13 x 13 image, and every conv under
    BASEBN_CONV_DEPTHWISE=0."""
    env = dict(os.environ, ONEDNN_VERBOSE="profile_exec", BASEBN_NUM_THREADS="1")
    env.pop("BASEBN_CONV_DEPTHWISE", None)
    if setting is not None:
        env["BASEBN_CONV_DEPTHWISE"] = setting
    proc = subprocess.run([sys.executable, "-c", DEPTHWISE_PROBE], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    onednn = {c: 0 for c in (8, 6, 10, 12)}
    multiplier_2 = 0
    for line in proc.stdout.splitlines():
        fields = line.split(",")
        if line.startswith("onednn_verbose") and "exec" in fields and "convolution" in fields:
            for c in onednn:
                onednn[c] += f"g{c}mb2_ic{c}oc{c}_" in line
            multiplier_2 += "g8mb2_ic8oc16_" in line
    assert multiplier_2 == 3, proc.stdout[-2000:]
    assert onednn == {c: 0 if c in own_kernels else 3 for c in onednn}, proc.stdout[-2000:]


@pytest.mark.parametrize("kernel, stride", [(3, 1), (3, 2), (5, 2)])
def test_depthwise_kernels_give_the_same_bits_at_any_thread_count(monkeypatch, kernel, stride):
    """basebn's depthwise kernels: each plane is one thread's task and each channel's weight gradient one
    thread's sum, in a fixed order, so 1 and 2 threads agree bit for bit."""
    rng = np.random.default_rng(9)
    x = mge.tensor(rng.standard_normal((4, 24, 30, 30)).astype(np.float32))
    w = mge.tensor(rng.standard_normal((24, 1, 1, kernel, kernel)).astype(np.float32))
    geom = conv_ops.ConvGeometry((stride, stride), (kernel // 2,) * 2, (1, 1), 24)
    runs = []
    for threads in ("1", "2"):
        monkeypatch.setenv("BASEBN_NUM_THREADS", threads)
        y = conv_ops.conv_forward(x, w, None, geom)
        dy = mge.tensor(np.cos(np.arange(math.prod(y.shape), dtype=np.float32)).reshape(y.shape))
        runs.append([a.numpy() for a in (y,) + conv_ops.conv_backward(dy, w, x, geom, with_bias=True)])
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


@pytest.fixture(scope="module", params=["avx2", "portable"])
def depthwise_harness(request, tmp_path_factory):
    """tests/support/depthwise_harness.cpp built with the kernels' AVX2 code, or with only their portable loops
    (what a CPU without AVX2 + FMA runs; this machine would never reach them through the ops)."""
    if shutil.which("g++") is None:
        pytest.skip("no g++")
    exe = tmp_path_factory.mktemp("harness") / request.param
    flags = ["-DBASEBN_DEPTHWISE_PORTABLE"] if request.param == "portable" else []
    subprocess.run(["g++", "-O2", "-std=c++14", "-Wall", "-Werror", "-fopenmp", *flags,
                    "-I", os.path.join(ROOT, "basebn", "ops", "csrc"),
                    os.path.join(ROOT, "tests", "support", "depthwise_harness.cpp"), "-o", str(exe)], check=True)
    return exe


@pytest.mark.parametrize("name", [n for n in CASES if n.startswith("depthwise") and CASES[n][4] == CASES[n][1]
                                  and CASES[n][8] == 1 and CASES[n][5][0] in (3, 5, 7) and CASES[n][6] in (1, 2)])
def test_depthwise_kernels_match_float64_reference_with_and_without_avx2(name, depthwise_harness, tmp_path):
    """Both builds of conv_depthwise_cpu.h, on every depthwise case (small planes too: called directly, not by the
    ops' 14 x 14 rule), against the float64 transcription: y + bias, dx + the added gradient, dW, db."""
    n, c, h, w, o, (k, _), stride, pad, dil, groups, bias = CASES[name]
    x, wd, b, rng = make_inputs(CASES[name], seed=3)
    b = rng.standard_normal(c).astype(np.float32)  # always a bias here
    ho_wo = taps(x.shape, wd.shape, stride, pad, dil)[1]
    dy = rng.standard_normal((n, c) + ho_wo).astype(np.float32)
    added = rng.standard_normal(x.shape).astype(np.float32)
    for key, arr in (("x", x), ("w", wd), ("b", b), ("dy", dy), ("add", added)):
        arr.tofile(tmp_path / f"{key}.f32")
    subprocess.run([str(depthwise_harness), *(str(v) for v in (n, c, h, w, k, stride, pad)), str(tmp_path)],
                   check=True, timeout=60)
    y_ref, dx_ref, dw_ref, db_ref = reference(x, wd, b, dy, stride, pad, dil, groups)
    got = {key: np.fromfile(tmp_path / f"{key}.f32", np.float32) for key in ("y", "dx", "dw", "db")}
    assert rel_err(got["y"].reshape(y_ref.shape), y_ref) <= TOL
    assert rel_err(got["dx"].reshape(dx_ref.shape), dx_ref + added) <= TOL
    assert rel_err(got["dw"].reshape(dw_ref.shape), dw_ref) <= TOL
    assert rel_err(got["db"], db_ref) <= TOL
