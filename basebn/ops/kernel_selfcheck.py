"""Every custom op against the pure-MegEngine path on the device at hand (``python -m basebn.tools.selfcheck``).

:func:`run_selfcheck` gives one :class:`CheckRow` per op: the BN ops (:mod:`.bn_ops`, kernel vs fallback;
float32 and float16, 2D-5D, strided gather path, non-contiguous, N=1, C=1) and the fused BN-activation ops on the
same cases; on CPU the oneDNN conv ops vs ``F.conv2d`` and its gradients, the max-pool ops (built with them) vs
``F.max_pool2d`` and its gradient on inputs full of ties, the matmul op vs ``F.matmul`` (SyncBatchNorm across
processes: :mod:`basebn.tools.selfcheck`, which builds on :class:`ErrorTally`, :func:`timed` and :func:`skipped_rows`).
``rel`` = max|kernel - reference| / max|reference| (``abs`` = the numerator); an op fails when rel > its
tolerance (:data:`TOLERANCES`) or it raises:
- ``float32`` 1e-4: both paths accumulate float32 sums (<= ~1e5 terms here) in different orders, a few
  1e-6 apart at most; a wrong constant, index or stride is >= 1e-3.
- ``float16`` 4e-3 (float16 outputs): each path rounds to float16 (2**-11 relative), so results may sit
  one float16 ulp (<= 2**-10 of the largest value) apart. Statistics of float16 inputs are float32.
- ``conv`` 1e-4 (also the matmul): float32 sums of <= ~600 products by different algorithms.
- ``pool`` 1e-6: y is a copy of one input; dx sums at most a few dy (window overlaps), in the same order as
  MegEngine; a lost or extra tie moves dx by a whole dy.
The automatic form in training is :mod:`.kernel_autocheck`.
"""
import contextlib
import math
import os
import platform
import time
from typing import NamedTuple

import numpy as np

import megengine as mge
import megengine.functional as F
from megengine.autodiff import GradManager

from . import bn_ops
from .bn_ops import kernel as bn_kernel
from .conv_ops import ConvGeometry, conv_backward_data, conv_backward_weights, conv_forward
from .kernel_library import conv_kernel_available, conv_kernel_error, kernel_error, load_kernels
from .matmul_ops import matmul
from .pool_ops import PoolGeometry, max_pool_backward, max_pool_forward

__all__ = ["TOLERANCES", "BN_OPS", "BN_ACT_OPS", "RUNNING_OPS", "CONV_OPS", "POOL_OPS", "MATMUL_OPS", "FAMILIES",
           "CheckRow", "ErrorTally",
           "device_name", "device_is_gpu", "timed", "skip_reason", "skipped_rows", "failed_rows", "run_selfcheck",
           "format_rows"]

TOLERANCES = {"float32": 1e-4, "float16": 4e-3, "conv": 1e-4, "pool": 1e-6}
BN_OPS = ("bn_stats", "bn_normalize", "bn_backward_reduce", "bn_backward_elemt")
# the fused BN -> activation ops (bn_ops.bn_act_*): in the "bn" family, on the same backend switch
BN_ACT_OPS = ("bn_act_normalize", "bn_add_act_normalize", "bn_act_backward_reduce", "bn_act_backward_elemt",
              "bn_add_act_backward_elemt", "bn_act_train_forward", "bn_act_train_backward")
RUNNING_OPS = ("bn_running_update",)  # the guarded running-statistics update (bn_ops.bn_running_update)
CONV_OPS = ("conv_fwd", "conv_bwd_data", "conv_bwd_filter")
# the max-pool ops: built with the conv ops and on the same switch ($BASEBN_CONV_BACKEND), so in their family
POOL_OPS = ("max_pool_fwd", "max_pool_bwd")
MATMUL_OPS = ("matmul",)  # the Linear layers' op: built with the conv ops, on the same switch
FAMILIES = {"bn": BN_OPS + BN_ACT_OPS + RUNNING_OPS, "conv": CONV_OPS + POOL_OPS + MATMUL_OPS}
_EPS = 1e-5


class CheckRow(NamedTuple):
    """One op's result: ``verdict`` is ``"ok"``, ``"FAIL"`` or ``"skip"`` (``note`` says why / what failed)."""

    op: str
    family: str
    cases: int
    max_abs: float
    max_rel: float
    tol: float
    kernel_ms: float
    fallback_ms: float
    verdict: str
    note: str = ""


def device_is_gpu():
    """True when new tensors land on a GPU (the default device)."""
    return mge.tensor(0.0).device.physical_name.startswith("gpu")


def device_name():
    """The kind of device the ops run on now: ``"cuda:<GPU name>"`` or ``"cpu:<CPU model>"``."""
    physical = mge.tensor(0.0).device.physical_name  # "cpu0:0", "gpu3:0"
    if physical.startswith("gpu"):
        index = int(physical[3:].split(":")[0] or 0)
        try:
            name = getattr(mge.device.get_cuda_device_property(index), "name", None)
        except Exception:  # noqa: BLE001 - the name is a label only
            name = None
        return f"cuda:{name or 'gpu'}"
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), model)
    except OSError:
        pass
    return f"cpu:{model}"


# --------------------------------------------------------------------------------------- measuring
class ErrorTally:
    """Running max abs / rel error and summed timings of one op over its cases."""

    def __init__(self):
        self.cases, self.max_abs, self.max_rel, self.kernel_s, self.fallback_s = 0, 0.0, 0.0, 0.0, 0.0
        self.notes = []

    def compare(self, got, want, what):
        got = np.asarray(got.numpy() if isinstance(got, mge.Tensor) else got, np.float64)
        want = np.asarray(want.numpy() if isinstance(want, mge.Tensor) else want, np.float64)
        if got.shape != want.shape:
            raise AssertionError(f"{what}: shape {got.shape} != {want.shape}")
        if got.size == 0:
            return
        diff = np.abs(got - want)
        err = float(diff.max()) if np.all(np.isfinite(diff)) else math.inf
        rel = err / max(float(np.abs(want).max()), 1e-30)
        if rel > self.max_rel:
            self.notes = [what]
        self.max_abs, self.max_rel = max(self.max_abs, err), max(self.max_rel, rel)

    def row(self, op, family, tol):
        if self.max_rel > tol or not math.isfinite(self.max_rel):
            verdict, note = "FAIL", f"worst: {self.notes[0]}" if self.notes else ""
        else:
            verdict, note = "ok", ""
        return CheckRow(op, family, self.cases, self.max_abs, self.max_rel, tol, 1e3 * self.kernel_s,
                        1e3 * self.fallback_s, verdict, note)


def _sync(outputs):
    mge._full_sync()
    return outputs


def timed(fn, reps):
    """``fn()``'s result and its best wall time over ``reps`` more runs (the first run when reps is 0)."""
    start = time.perf_counter()
    out = _sync(fn())
    best = time.perf_counter() - start
    for _ in range(reps):
        start = time.perf_counter()
        _sync(fn())
        best = min(best, time.perf_counter() - start)
    return out, best


@contextlib.contextmanager
def _strided_kernels(enabled):
    """The kernels read every input through its strides (their non-contiguous path) while active."""
    prev = bn_kernel._force_strided
    bn_kernel._force_strided = bool(enabled)
    try:
        yield
    finally:
        bn_kernel._force_strided = prev


def _both(fn, reps, strided=False):
    """(kernel result, fallback result, kernel s, fallback s) of ``fn()`` on the two BN paths."""
    with bn_ops.use_backend("kernel"), _strided_kernels(strided):
        got, tk = timed(fn, reps)
    with bn_ops.use_backend("fallback"):
        want, tf = timed(fn, reps)
    return got, want, tk, tf


# ---------------------------------------------------------------------------------------- BN ops
def _bn_cases(quick, gpu):
    """(shape, dtype, layout): layout "contiguous", "strided" (the kernels' gather path) or "transposed"."""
    shapes = [(4, 6, 9, 7), (8, 5), (1, 4, 8, 8), (6, 1, 5, 5)] if quick else [
        (8, 5), (4, 3, 17), (4, 6, 9, 7), (2, 3, 4, 5, 6), (1, 4, 8, 8), (6, 1, 5, 5), (3, 64, 7, 7),
        (16, 32, 32, 32)]
    cases = [(s, "float32", "contiguous") for s in shapes]
    cases += [((4, 6, 9, 7), "float32", "strided"), ((5, 3, 6, 4), "float32", "transposed")]
    if not quick:
        cases += [((3, 4, 5, 6, 2), "float32", "strided"), ((7, 5), "float32", "transposed")]
    if gpu or not quick:
        cases += [((4, 6, 9, 7), "float16", "contiguous"), ((4, 6, 9, 7), "float16", "strided")]
        if not quick:
            cases += [((8, 5), "float16", "contiguous"), ((2, 3, 4, 5, 6), "float16", "contiguous")]
    return cases


def _tensor(values, dtype, layout):
    """``values`` as a tensor of ``dtype``; "transposed": a non-contiguous view with the same values."""
    if layout != "transposed":
        return mge.tensor(values.astype(dtype))
    axes = (1, 0) + tuple(range(2, values.ndim))
    return F.transpose(mge.tensor(np.ascontiguousarray(values.transpose(axes)).astype(dtype)), axes)


def _bn_case_inputs(shape, dtype, layout, rng):
    c = shape[1]
    bshape = (1, c) + (1,) * (len(shape) - 2)
    offset = (2.0 + 0.5 * np.arange(c)).reshape(bshape)  # |mean| > std: checks the centring
    scale = (0.5 + rng.random(c)).reshape(bshape)
    x = _tensor(rng.standard_normal(shape) * scale + offset, dtype, layout)
    dy = _tensor(rng.standard_normal(shape), dtype, layout)
    return x, dy


def _check_bn(quick, reps, gpu):
    """Rows per op and input dtype (``"bn_normalize"``, ``"bn_normalize float16"``, ...)."""
    rng = np.random.default_rng(0)
    errs = {}

    def record(op, dtype, pairs, tk, tf):
        e = errs.setdefault((op, dtype), ErrorTally())
        for got, want, what in pairs:
            e.compare(got, want, what)
        e.cases, e.kernel_s, e.fallback_s = e.cases + 1, e.kernel_s + tk, e.fallback_s + tf

    for i, (shape, dtype, layout) in enumerate(_bn_cases(quick, gpu)):
        x, dy = _bn_case_inputs(shape, dtype, layout, rng)
        strided = layout == "strided"
        what = f"{dtype} {shape} {layout}"
        cnt, c = bn_ops.channel_count(x), shape[1]
        weight = mge.tensor(rng.uniform(0.5, 1.5, c).astype(np.float32)) if i % 2 == 0 else None
        bias = mge.tensor(rng.standard_normal(c).astype(np.float32)) if i % 3 != 1 else None

        (km, km2), (fm, fm2), tk, tf = _both(lambda: bn_ops.bn_stats(x), reps, strided)
        record("bn_stats", dtype, [(km, fm, f"mean {what}"), (km2, fm2, f"m2 {what}")], tk, tf)
        mean, invstd = fm, (fm2 * (1.0 / cnt) + _EPS) ** -0.5
        got, want, tk, tf = _both(lambda: bn_ops.bn_normalize(x, mean, invstd, weight, bias), reps, strided)
        record("bn_normalize", dtype, [(got, want, f"y {what}")], tk, tf)
        (k1, k2), (f1, f2), tk, tf = _both(lambda: bn_ops.bn_backward_reduce(dy, x, mean, invstd), reps, strided)
        record("bn_backward_reduce", dtype, [(k1, f1, f"sum_dy {what}"), (k2, f2, f"sum_dy_xhat {what}")], tk, tf)
        got, want, tk, tf = _both(
            lambda: bn_ops.bn_backward_elemt(dy, x, mean, invstd, weight, f1, f2, cnt), reps, strided)
        record("bn_backward_elemt", dtype, [(got, want, f"dx {what}")], tk, tf)
    rows = []
    for dtype in ("float32", "float16"):
        for op in BN_OPS:
            if (op, dtype) in errs:  # y and dx have x's dtype; the per-channel outputs are float32
                tol = TOLERANCES[dtype] if op in ("bn_normalize", "bn_backward_elemt") else TOLERANCES["float32"]
                label = op if dtype == "float32" else f"{op} {dtype}"
                rows.append(errs[(op, dtype)].row(label, "bn", tol))
    return rows + _check_bn_act(quick, reps, gpu) + _check_running_update(reps)


def _check_bn_act(quick, reps, gpu):
    """Rows per fused BN-activation op and input dtype, on the cases of :func:`_check_bn` (activations in turn; the
    residual ops only for the activations that have that form)."""
    rng = np.random.default_rng(3)
    errs = {(op, dtype): ErrorTally() for op in BN_ACT_OPS for dtype in ("float32", "float16")}
    for i, (shape, dtype, layout) in enumerate(_bn_cases(quick, gpu)):
        x, dy = _bn_case_inputs(shape, dtype, layout, rng)
        sc = _tensor(rng.standard_normal(shape), dtype, layout)
        act, c, cnt = ("relu", "relu6", "identity", "silu", "hswish")[i % 5], shape[1], bn_ops.channel_count(x)
        residual = act not in bn_ops.PRE_GRAD_ACTIVATIONS
        w = mge.tensor(rng.uniform(0.5, 1.5, c).astype(np.float32))
        b = mge.tensor(rng.standard_normal(c).astype(np.float32))
        with bn_ops.use_backend("fallback"):
            mean, m2 = bn_ops.bn_stats(x)
            invstd = (m2 * (1.0 / cnt) + _EPS) ** -0.5
            y = bn_ops.bn_act_normalize(x, mean, invstd, w, b, act=act, shortcut=sc if residual else None)
            s1, s2 = bn_ops.bn_act_backward_reduce(dy, y, x, mean, invstd, act=act, weight=w, bias=b)
        calls = {
            "bn_act_normalize": lambda: (bn_ops.bn_act_normalize(x, mean, invstd, w, b, act=act),),
            "bn_add_act_normalize": lambda: (bn_ops.bn_act_normalize(x, mean, invstd, w, b, act=act, shortcut=sc),),
            "bn_act_backward_reduce": lambda: bn_ops.bn_act_backward_reduce(dy, y, x, mean, invstd, act=act,
                                                                            weight=w, bias=b),
            "bn_act_backward_elemt": lambda: (bn_ops.bn_act_backward_elemt(dy, y, x, mean, invstd, w, s1, s2, cnt,
                                                                           act=act, bias=b),),
            "bn_add_act_backward_elemt": lambda: bn_ops.bn_act_backward_elemt(dy, y, x, mean, invstd, w, s1, s2, cnt,
                                                                              act=act, shortcut_grad=True, bias=b),
            # the one-call local training passes (CPU kernels; composed from the ops above on GPU)
            "bn_act_train_forward": lambda: bn_ops.bn_act_train_forward(x, w, b, _EPS, act, sc if residual else None),
            "bn_act_train_backward": lambda: tuple(t for t in bn_ops.bn_act_train_backward(
                dy, y, x, mean, invstd, w, b, act, shortcut_grad=residual) if t is not None)}
        if not residual:
            calls = {op: call for op, call in calls.items() if not op.startswith("bn_add_")}
        for op, call in calls.items():
            got, want, tk, tf = _both(call, reps, layout == "strided")
            e = errs[(op, dtype)]
            for j, (g, f) in enumerate(zip(got, want)):
                e.compare(g, f, f"output {j} {act} {dtype} {shape} {layout}")
            e.cases, e.kernel_s, e.fallback_s = e.cases + 1, e.kernel_s + tk, e.fallback_s + tf
    rows = []
    for dtype in ("float32", "float16"):
        for op in BN_ACT_OPS:
            if errs[(op, dtype)].cases:  # the reduce's sums are float32; the other outputs have x's dtype
                tol = TOLERANCES["float32"] if op == "bn_act_backward_reduce" else TOLERANCES[dtype]
                rows.append(errs[(op, dtype)].row(op if dtype == "float32" else f"{op} {dtype}", "bn", tol))
    return rows


def _check_running_update(reps):
    """One row: the guarded running-statistics update on finite and non-finite batches, (C,) and MegEngine's
    (1, C, 1, 1) buffers (all three outputs: the two statistics and the non-finite count)."""
    rng = np.random.default_rng(4)
    e = ErrorTally()
    for shape in ((64,), (1, 256, 1, 1)):
        for finite in (True, False):
            rm, m = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
            rv, v = (rng.random(shape).astype(np.float32) + 0.5 for _ in range(2))
            if not finite:
                m.reshape(-1)[1] = np.nan
            args = [mge.tensor(a) for a in (rm, rv, m, v)] + [mge.tensor(np.zeros(1, np.int32))]
            got, want, tk, tf = _both(lambda: bn_ops.bn_running_update(*args[:4], 0.9, args[4]), reps)
            for name, g, f in zip(("running_mean", "running_var", "count"), got, want):
                e.compare(g, f, f"{name} {shape} {'finite' if finite else 'non-finite'}")
            e.cases, e.kernel_s, e.fallback_s = e.cases + 1, e.kernel_s + tk, e.fallback_s + tf
    return [e.row("bn_running_update", "bn", TOLERANCES["float32"])]


# -------------------------------------------------------------------------------------- conv ops
def _conv_cases(quick):
    """(x shape, weight shape, stride, padding, dilation, groups, bias)."""
    cases = [((2, 4, 9, 9), (6, 4, 3, 3), 1, 1, 1, 1, True), ((2, 4, 8, 8), (2, 3, 2, 3, 3), 1, 1, 1, 2, False),
             ((2, 8, 14, 14), (16, 8, 1, 1), 1, 0, 1, 1, True),  # pointwise on oneDNN's NCHW kernels
             ((2, 6, 16, 17), (6, 1, 1, 3, 3), 2, 1, 1, 6, True)]  # depthwise on basebn's (conv_depthwise_cpu.h)
    if not quick:
        cases += [((2, 3, 10, 10), (5, 3, 3, 3), 2, 1, 1, 1, False), ((2, 6, 7, 7), (6, 1, 1, 3, 3), 1, 1, 1, 6, True),
                  ((4, 16, 5, 5), (8, 16, 1, 1), 1, 0, 1, 1, True), ((1, 3, 11, 11), (4, 3, 3, 3), 1, 2, 2, 1, False),
                  ((3, 8, 16, 16), (16, 8, 3, 3), 2, 1, 1, 1, True)]
    return cases


def _megengine_conv(x, w, b, dy, stride, pad, dil, groups, backward=True):
    """y, dx, dw, db of MegEngine's conv (F.conv2d and its gradients); y alone without ``backward``."""
    x, w = mge.tensor(x), mge.tensor(w)
    bias = None if b is None else mge.tensor(b.reshape(1, -1, 1, 1))
    if not backward:
        return F.conv2d(x, w, bias, stride=stride, padding=pad, dilation=dil, groups=groups)
    gm = GradManager().attach([x, w] + ([] if bias is None else [bias]))
    with gm:
        y = F.conv2d(x, w, bias, stride=stride, padding=pad, dilation=dil, groups=groups)
        gm.backward(y, mge.tensor(dy))
    return y, x.grad, w.grad, None if bias is None else bias.grad.reshape(-1)


def _check_conv(quick, reps):
    rng = np.random.default_rng(1)
    errs = {op: ErrorTally() for op in CONV_OPS}
    for xs, ws, stride, pad, dil, groups, with_bias in _conv_cases(quick):
        x = rng.standard_normal(xs).astype(np.float32)
        w = rng.standard_normal(ws).astype(np.float32)
        b = rng.standard_normal(ws[0] * (ws[1] if len(ws) == 5 else 1)).astype(np.float32) if with_bias else None
        kh, kw = ws[-2:]
        ho = (xs[2] + 2 * pad - dil * (kh - 1) - 1) // stride + 1
        wo = (xs[3] + 2 * pad - dil * (kw - 1) - 1) // stride + 1
        out_c = ws[0] * (ws[1] if len(ws) == 5 else 1)
        dy = rng.standard_normal((xs[0], out_c, ho, wo)).astype(np.float32)
        geom = ConvGeometry((stride, stride), (pad, pad), (dil, dil), groups)
        what = f"x {xs} w {ws} stride {stride} pad {pad} dil {dil} groups {groups} bias {with_bias}"
        (y, dx, dw, db), t_step = timed(lambda: _megengine_conv(x, w, b, dy, stride, pad, dil, groups), reps)
        _, t_fwd = timed(lambda: _megengine_conv(x, w, b, dy, stride, pad, dil, groups, backward=False), reps)
        t_bwd = max(t_step - t_fwd, 0.0) / 2  # MegEngine's two gradients, timed together: half each
        xt, wt, dyt = mge.tensor(x), mge.tensor(w), mge.tensor(dy)
        bt = None if b is None else mge.tensor(b)
        got, tk = timed(lambda: conv_forward(xt, wt, bt, geom), reps)
        errs["conv_fwd"].compare(got, y, f"y {what}")
        got_dx, tkd = timed(lambda: conv_backward_data(dyt, wt, xs[2:], geom), reps)
        errs["conv_bwd_data"].compare(got_dx, dx, f"dx {what}")
        (got_dw, got_db), tkw = timed(lambda: conv_backward_weights(xt, dyt, (kh, kw), geom, with_bias), reps)
        errs["conv_bwd_filter"].compare(got_dw, dw, f"dw {what}")
        if with_bias:
            errs["conv_bwd_filter"].compare(got_db, db, f"db {what}")
        for op, t, t_ref in (("conv_fwd", tk, t_fwd), ("conv_bwd_data", tkd, t_bwd), ("conv_bwd_filter", tkw, t_bwd)):
            e = errs[op]
            e.cases, e.kernel_s, e.fallback_s = e.cases + 1, e.kernel_s + t, e.fallback_s + t_ref
    return [errs[op].row(op, "conv", TOLERANCES["conv"]) for op in CONV_OPS]


# ----------------------------------------------------------------------------------- max-pool ops
def _pool_cases(quick):
    """(x shape, kernel, stride, padding, layout): layout "contiguous" or "transposed" (a non-contiguous view)."""
    cases = [((2, 4, 9, 9), 3, 2, 1, "contiguous"), ((2, 3, 8, 8), 2, 2, 0, "contiguous")]
    if not quick:
        cases += [((1, 1, 7, 6), 3, 2, 1, "contiguous"), ((3, 5, 9, 7), 3, 2, 1, "transposed"),
                  ((2, 3, 11, 10), (3, 5), (2, 3), (1, 2), "contiguous"), ((2, 3, 6, 6), 3, 1, 1, "contiguous"),
                  ((4, 16, 28, 28), 3, 2, 1, "contiguous")]
    return cases


def _megengine_max_pool(x, dy, kernel, stride, pad):
    """y and dx of MegEngine's max pool (F.max_pool2d and its gradient)."""
    x = mge.tensor(x)
    gm = GradManager().attach([x])
    with gm:
        y = F.max_pool2d(x, kernel, stride, pad)
        gm.backward(y, mge.tensor(dy))
    return y, x.grad


def _pair(v):
    return tuple(v) if isinstance(v, tuple) else (v, v)


def _check_pool(quick, reps):
    """The max-pool ops vs MegEngine's on rectified inputs rounded to a few levels: many windows hold ties."""
    rng = np.random.default_rng(4)
    errs = {op: ErrorTally() for op in POOL_OPS}
    for xs, kernel, stride, pad, layout in _pool_cases(quick):
        x = np.maximum(np.round(rng.standard_normal(xs) * 2) / 2, 0).astype(np.float32)
        geom = PoolGeometry(_pair(kernel), _pair(stride), _pair(pad))
        dy = rng.standard_normal((xs[0], xs[1]) + geom.output_hw(xs[2:])).astype(np.float32)
        what = f"x {xs} kernel {kernel} stride {stride} pad {pad} {layout}"
        (y_ref, dx_ref), t_ref = timed(lambda: _megengine_max_pool(x, dy, kernel, stride, pad), reps)
        xt, dyt = _tensor(x, "float32", layout), mge.tensor(dy)
        y, tk = timed(lambda: max_pool_forward(xt, geom), reps)
        errs["max_pool_fwd"].compare(y, y_ref, f"y {what}")
        dx, tkb = timed(lambda: max_pool_backward(dyt, xt, y, geom), reps)
        errs["max_pool_bwd"].compare(dx, dx_ref, f"dx {what}")
        for op, t in (("max_pool_fwd", tk), ("max_pool_bwd", tkb)):  # (MegEngine's fwd + bwd, timed together)
            e = errs[op]
            e.cases, e.kernel_s, e.fallback_s = e.cases + 1, e.kernel_s + t, e.fallback_s + t_ref / 2
    return [errs[op].row(op, "conv", TOLERANCES["pool"]) for op in POOL_OPS]


# ------------------------------------------------------------------------------------- matmul op
def _check_matmul(quick, reps):
    """The matmul op vs F.matmul in the three forms a Linear layer uses (x W^T + b, dy W, dy^T x), and with a
    non-contiguous input."""
    rng = np.random.default_rng(5)
    e = ErrorTally()
    sizes = [(8, 24, 10)] + ([] if quick else [(1, 7, 3), (32, 512, 100)])
    for m, k, n in sizes:
        a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((n, k)).astype(np.float32)
        bias = rng.standard_normal(n).astype(np.float32)
        at, bt, biast = mge.tensor(a), mge.tensor(b), mge.tensor(bias)
        dy = mge.tensor(rng.standard_normal((m, n)).astype(np.float32))
        cases = (("x W^T + b", lambda: matmul(at, bt, trans_b=True, bias=biast),
                  lambda: F.matmul(at, bt, transpose_b=True) + biast),
                 ("dy W", lambda: matmul(dy, bt), lambda: F.matmul(dy, bt)),
                 ("dy^T x", lambda: matmul(dy, at, trans_a=True), lambda: F.matmul(dy, at, transpose_a=True)),
                 ("x W^T, x a non-contiguous view",
                  lambda: matmul(_tensor(a, "float32", "transposed"), bt, trans_b=True),
                  lambda: F.matmul(at, bt, transpose_b=True)))
        for what, ours, theirs in cases:
            want, t_ref = timed(theirs, reps)
            got, tk = timed(ours, reps)
            e.compare(got, want, f"{what} ({m}, {k}, {n})")
            e.cases, e.kernel_s, e.fallback_s = e.cases + 1, e.kernel_s + tk, e.fallback_s + t_ref
    return [e.row("matmul", "conv", TOLERANCES["conv"])]


# ----------------------------------------------------------------------------------------- driver
def skipped_rows(ops, family, reason):
    """One ``"skip"`` row per op of ``ops``, noting ``reason``."""
    return [CheckRow(op, family, 0, math.nan, math.nan, math.nan, math.nan, math.nan, "skip", reason) for op in ops]


def failed_rows(ops, family, exc):
    """One ``"FAIL"`` row per op of ``ops``: the check raised ``exc``."""
    note = f"raised {type(exc).__name__}: {exc}".splitlines()[0][:300]
    return [CheckRow(op, family, 0, math.inf, math.inf, math.nan, math.nan, math.nan, "FAIL", note) for op in ops]


def skip_reason(family, lib, gpu):
    """Why ``family``'s kernels cannot be checked here (library ``lib`` from :func:`load_kernels`), else None.
    ``family``: ``"bn"``, ``"conv"``, or a check built on the BN kernels (``"sync_bn"``)."""
    if lib is None:
        return f"the kernel library did not build: {kernel_error()}"
    if family == "conv" and gpu:
        return "the oneDNN conv, max-pool and matmul ops are CPU-only"
    if family == "conv" and not conv_kernel_available():
        return conv_kernel_error()
    if family != "conv" and gpu and not lib["cuda"]:
        return "the kernel library was built without CUDA (no toolkit found, or BASEBN_KERNEL_CUDA=0)"
    return None


def run_selfcheck(quick=False, families=("bn", "conv")):
    """One :class:`CheckRow` per op of ``families`` (``"bn"``, ``"conv"``: :data:`FAMILIES`) on the current device.

    ``quick``: a few small cases, no repeated timing (what training runs). A family that cannot run here
    (kernels not built, conv on GPU) gives ``"skip"`` rows; an op that raises fails.
    """
    lib = load_kernels()
    gpu = device_is_gpu()
    reps = 0 if quick else 2
    rows = []
    for family in families:
        reason = skip_reason(family, lib, gpu)
        if reason:
            rows += skipped_rows(FAMILIES[family], family, reason)
            continue
        check = {"bn": lambda: _check_bn(quick, reps, gpu),
                 "conv": lambda: _check_conv(quick, reps) + _check_pool(quick, reps) + _check_matmul(quick, reps)}
        try:
            rows += check[family]()
        except Exception as exc:  # noqa: BLE001 - an op that raises disagrees with MegEngine
            rows += failed_rows(FAMILIES[family], family, exc)
    return rows


def format_rows(rows):
    """The rows as an aligned text table (op, cases, max abs err, max rel err, tolerance, ms, verdict)."""
    head = ("op", "cases", "max abs err", "max rel err", "tol", "kernel ms", "fallback ms", "verdict")
    lines = [head]
    for r in rows:
        num = lambda v, f: "-" if not math.isfinite(v) and r.verdict == "skip" else format(v, f)  # noqa: E731
        lines.append((r.op, str(r.cases), num(r.max_abs, ".2e"), num(r.max_rel, ".2e"), num(r.tol, ".0e"),
                      num(r.kernel_ms, ".2f"), num(r.fallback_ms, ".2f"),
                      r.verdict + (f"  ({r.note})" if r.note else "")))
    widths = [max(len(line[i]) for line in lines) for i in range(len(head) - 1)]
    return os.linesep.join("  ".join(v.ljust(w) for v, w in zip(line, widths)) + "  " + line[-1]
                           for line in lines)
