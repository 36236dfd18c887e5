"""python benchmarks/cuda/run_harness.py [--quick] [--no-timing] [--arch 90] [--build-dir DIR] [--json PATH]
        [--results results/cuda_bn.json]

basebn's CUDA BN kernels on a GPU without MegEngine, against PyTorch (details: benchmarks/cuda/README.md):
1. compile: nvcc builds basebn/ops/csrc/bn_cuda_launch.cu (no MegEngine header) into a shared library, for the
   GPU's architecture; without a GPU or PyTorch, for sm_75/80/90 only: a compile-only check, then it stops.
2. correctness against torch.nn.functional.batch_norm in float64 (autograd for the backward): batch mean and
   variance, y, running mean/var (MegEngine's momentum, unbiased variance), dx, dweight, dbias; 2D-5D, N=1,
   C=1, C not a power of two, C > 65535, huge N*H*W, non-contiguous inputs and the strided path, no affine,
   float16 in / float32 statistics.
3. fused BN -> activation (ReLU, ReLU6, SiLU, HSwish, identity; + shortcut: BN-add-ReLU) vs float64 torch:
   y, dx, dweight, dbias, dshortcut; the ReLU/ReLU6 derivative read from the output rounded to its dtype.
4. SyncBN: per-shard statistics of uneven shards (one empty) merged as the all-gather path does (float32
   rows, Chan's merge in float64: basebn/layers/moments.py), backward sums all-reduced, vs the whole batch.
5. timing: basebn (stats + normalize + running update; backward reduce + elemt) vs torch's batch_norm
   (cuDNN when torch picks it) for the zoo's ResNet-20 shapes and ResNet-50's, float32 and float16; then
   fused BN-ReLU and BN-add-ReLU vs torch's batch_norm -> relu_ (-> add) on ResNet-50's shapes.
Error = max|kernel - reference| / max|reference|; tolerance 1e-4 (float32 outputs), 2e-3 (float16 outputs).
Exit 0: every check passed, or skipped with the reason printed (no nvcc, no PyTorch, no GPU); 1: a compile
or a check failed. One GPU (the current torch device; pick another with CUDA_VISIBLE_DEVICES). ``--results FILE``
appends a run once the checks ran on a GPU: checks_passed, and basebn / torch per layer from the CUDA-graph times
(cudnn_ratio_56_and_larger, cudnn_ratio_28_and_smaller: min-max over the shapes of that size, both dtypes).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

sys.path.append(os.path.dirname(HERE))  # benchmarks/: the shared results-file writer

from bn_cuda_lib import COMPILE_ONLY_ARCHS, CudaBnKernels, build_library, find_nvcc  # noqa: E402
from results_file import add_results_argument, save_run  # noqa: E402
from shard_merge import all_reduce_sum, merge_rows, pack_row, shard_bounds  # noqa: E402

try:
    import torch
    import torch.nn.functional as TF
except ImportError:  # optional: without it the harness compiles only
    torch = TF = None

EPS = 1e-5
DEVICE = "cuda"  # where the tensors live ("cpu" lets a stand-in for the kernels smoke-test the Python)
KEEP = 0.9  # MegEngine's momentum: running = KEEP * running + (1 - KEEP) * batch
TOL = {"float32": 1e-4, "float16": 2e-3}

# (name, shape, dtype, layout, affine); layout: contiguous | transposed (N and C swapped in memory) |
# sliced (every other element of the last dim) | forced (contiguous, read through the strided path)
CASES = [
    ("2D", (64, 10), "float32", "contiguous", True),
    ("3D", (8, 6, 50), "float32", "contiguous", True),
    ("4D", (16, 24, 13, 11), "float32", "contiguous", True),
    ("5D", (4, 5, 6, 7, 8), "float32", "contiguous", True),
    ("N=1", (1, 7, 19, 23), "float32", "contiguous", True),
    ("C=1", (9, 1, 15, 17), "float32", "contiguous", True),
    ("C=1 2D", (300, 1), "float32", "contiguous", True),
    ("C=37 (not a power of two)", (8, 37, 9, 9), "float32", "contiguous", True),
    ("C=1000, S=9", (4, 1000, 3, 3), "float32", "contiguous", True),
    ("C=70000 > 65535 (grid loop)", (3, 70000), "float32", "contiguous", True),
    ("2D, many N", (4096, 3), "float32", "contiguous", True),
    ("no affine", (8, 12, 10, 10), "float32", "contiguous", False),
    ("non-contiguous (transposed)", (6, 8, 10, 12), "float32", "transposed", True),
    ("non-contiguous (sliced)", (6, 8, 10, 12), "float32", "sliced", True),
    ("strided path", (8, 12, 10, 10), "float32", "forced", True),
    ("strided path 5D", (3, 4, 5, 6, 7), "float32", "forced", True),
    ("float16 4D", (16, 24, 13, 11), "float16", "contiguous", True),
    ("float16 2D", (64, 10), "float16", "contiguous", True),
    ("float16 5D", (4, 5, 6, 7, 8), "float16", "contiguous", True),
    ("float16 transposed", (6, 8, 10, 12), "float16", "transposed", True),
    ("float16 strided path", (8, 12, 10, 10), "float16", "forced", False),
]
HUGE_CASES = [  # left out by --quick
    ("huge N*H*W = 2**25", (8, 2, 2048, 2048), "float32", "contiguous", True),
    ("huge N = 2**22, 2D", (1 << 22, 4), "float32", "contiguous", True),
    ("huge N*H*W float16", (8, 2, 2048, 2048), "float16", "contiguous", True),
]
# fused BN -> activation: (name, shape, dtype, layout, affine, act, with shortcut)
ACT_CASES = [
    ("relu 4D", (16, 24, 13, 11), "float32", "contiguous", True, "relu", False),
    ("relu6 4D", (16, 24, 13, 11), "float32", "contiguous", True, "relu6", False),
    ("silu 4D", (16, 24, 13, 11), "float32", "contiguous", True, "silu", False),
    ("hswish 4D", (16, 24, 13, 11), "float32", "contiguous", True, "hswish", False),
    ("add-relu 4D", (16, 24, 13, 11), "float32", "contiguous", True, "relu", True),
    ("add-identity 4D", (8, 12, 10, 10), "float32", "contiguous", True, "identity", True),
    ("relu 2D", (64, 10), "float32", "contiguous", True, "relu", False),
    ("relu6 5D", (4, 5, 6, 7, 8), "float32", "contiguous", True, "relu6", False),
    ("add-relu N=1 C=1", (1, 1, 15, 17), "float32", "contiguous", True, "relu", True),
    ("silu C=70000 2D", (3, 70000), "float32", "contiguous", True, "silu", False),
    ("silu no affine", (8, 12, 10, 10), "float32", "contiguous", False, "silu", False),
    ("hswish no affine", (8, 12, 10, 10), "float32", "contiguous", False, "hswish", False),
    ("add-relu transposed", (6, 8, 10, 12), "float32", "transposed", True, "relu", True),
    ("relu6 sliced", (6, 8, 10, 12), "float32", "sliced", True, "relu6", False),
    ("add-relu strided path", (8, 12, 10, 10), "float32", "forced", True, "relu", True),
    ("silu strided path", (8, 12, 10, 10), "float32", "forced", True, "silu", False),
    ("float16 relu", (16, 24, 13, 11), "float16", "contiguous", True, "relu", False),
    ("float16 relu6", (16, 24, 13, 11), "float16", "contiguous", True, "relu6", False),
    ("float16 silu", (16, 24, 13, 11), "float16", "contiguous", True, "silu", False),
    ("float16 hswish", (16, 24, 13, 11), "float16", "contiguous", True, "hswish", False),
    ("float16 add-relu", (16, 24, 13, 11), "float16", "contiguous", True, "relu", True),
    ("float16 add-relu transposed", (6, 8, 10, 12), "float16", "transposed", True, "relu", True),
]
# (name, full shape, dtype, per-rank batch sizes): uneven shards, one rank empty
MERGE_CASES = [
    ("4 ranks, one empty", (13, 6, 7, 5), "float32", [5, 0, 1, 7]),
    ("2 ranks 2D", (10, 4), "float32", [3, 7]),
    ("3 ranks float16", (9, 3, 8, 8), "float16", [4, 0, 5]),
    ("8 ranks of 1..4", (20, 16, 6, 6), "float32", [1, 4, 2, 3, 1, 4, 2, 3]),
]
# BN input shapes: the zoo's ResNet-20 (Fashion-MNIST, batch 128; stem stride 2, and 1 for "fullres") and
# ResNet-50 at 224x224 (batch 32 per GPU)
ZOO_SHAPES = [(128, 16, 14, 14), (128, 32, 7, 7), (128, 64, 4, 4), (128, 16, 28, 28), (128, 32, 14, 14),
              (128, 64, 7, 7)]
RESNET50_SHAPES = [(32, 64, 112, 112), (32, 64, 56, 56), (32, 128, 56, 56), (32, 256, 56, 56), (32, 128, 28, 28),
                   (32, 256, 28, 28), (32, 512, 28, 28), (32, 256, 14, 14), (32, 512, 14, 14), (32, 1024, 14, 14),
                   (32, 512, 7, 7), (32, 2048, 7, 7)]


def rel_err(got, ref):
    """max|got - ref| / max|ref| (float64; the absolute error when ref is all zeros)."""
    got = got.detach().double().cpu().numpy() if hasattr(got, "detach") else np.asarray(got, np.float64)
    ref = ref.detach().double().cpu().numpy() if hasattr(ref, "detach") else np.asarray(ref, np.float64)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    if got.size == 0:
        return 0.0
    err = np.abs(got - ref).max()
    if not np.isfinite(err):
        return float("inf")
    scale = np.abs(ref).max()
    return float(err / scale) if scale > 0 else float(err)


def _sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _dims(shape):
    return [0] + list(range(2, len(shape)))


def _bshape(shape):
    return (1, shape[1]) + (1,) * (len(shape) - 2)


def make_input(shape, dtype, layout, offset=True, seed=0):
    """A CUDA tensor of ``shape`` and ``dtype`` laid out as ``layout`` (see CASES); per-channel offsets |mean| > std.

    Values are made in the storage's own layout, then viewed: the view is what the kernels get."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    store = list(shape)
    if layout == "sliced":
        store[-1] *= 2
    channel_dim = 0 if layout == "transposed" else 1
    if layout == "transposed":
        store[0], store[1] = store[1], store[0]
    base = torch.randn(store, generator=g, device=DEVICE, dtype=torch.float32)
    if offset:
        c = torch.arange(shape[1], device=DEVICE, dtype=torch.float32)
        per_channel = [1] * len(store)
        per_channel[channel_dim] = shape[1]
        base = base * (0.5 + (c % 5) * 0.25).reshape(per_channel) + (2.0 + (c % 7) * 0.5).reshape(per_channel)
    out = base.to(getattr(torch, dtype)).contiguous()
    if layout == "transposed":
        out = out.transpose(0, 1)
    if layout == "sliced":
        out = out[..., ::2]
    assert tuple(out.shape) == tuple(shape) and out.is_contiguous() == (layout in ("contiguous", "forced"))
    return out


def channel(c, seed, low=None, high=None):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    v = torch.rand(c, generator=g, device=DEVICE) if low is not None else torch.randn(c, generator=g, device=DEVICE)
    return v * (high - low) + low if low is not None else v


def _badness(row):
    """error / tolerance (a zero tolerance: 0 when exact, else inf)."""
    if row["tol"] > 0:
        return row["err"] / row["tol"]
    return np.inf if row["err"] > 0 else 0.0


class Report:
    """Collects (section, case, quantity, error, tolerance) rows; prints them, counts the failures."""

    def __init__(self):
        self.rows = []

    def add(self, section, case, what, err, tol):
        self.rows.append(dict(section=section, case=case, what=what, err=err, tol=tol, ok=bool(err <= tol)))

    def failures(self):
        return [r for r in self.rows if not r["ok"]]

    def print_case_summary(self, section):
        by_case = {}
        for r in self.rows:
            if r["section"] == section:
                by_case.setdefault(r["case"], []).append(r)
        for case, rows in by_case.items():
            worst = max(rows, key=_badness)
            bad = [r["what"] for r in rows if not r["ok"]]
            verdict = "ok" if not bad else "FAIL: " + ", ".join(f"{r['what']} {r['err']:.2e} > {r['tol']:.0e}"
                                                               for r in rows if not r["ok"])
            print(f"  {case:34s} worst {worst['what']:>13s} {worst['err']:.2e} (tol {worst['tol']:.0e})  {verdict}")


# ------------------------------------------------------------------------------ correctness
def check_case(k, report, name, shape, dtype, layout, affine, section="batch_norm"):
    """One forward + backward + running-statistics step of the kernels vs float64 torch."""
    forced = layout == "forced"
    x = make_input(shape, dtype, layout, seed=1)
    dy = make_input(shape, dtype, layout, offset=False, seed=2)
    c = shape[1]
    cnt = x.numel() // c
    w = channel(c, 3, 0.5, 1.5) if affine else None
    b = channel(c, 4) if affine else None
    rm0, rv0 = channel(c, 5), channel(c, 6, 0.5, 2.0)
    tol_out = TOL[dtype]

    mean, m2 = k.stats(x, forced)
    invstd = (m2 * (1.0 / cnt) + EPS) ** -0.5  # as bn_function: float32, on the device
    y = k.normalize(x, mean, invstd, w, b, forced)
    rm = rm0 * KEEP + mean * (1 - KEEP)
    rv = rv0 * KEEP + m2 * (1.0 / (cnt - 1)) * (1 - KEEP)
    s1, s2 = k.backward_reduce(dy, x, mean, invstd, forced)
    dx = k.backward_elemt(dy, x, mean, invstd, w, s1, s2, cnt, forced)
    _sync()

    x64 = x.double().requires_grad_(True)
    w64 = w.double().requires_grad_(True) if affine else None
    b64 = b.double().requires_grad_(True) if affine else None
    rm64, rv64 = rm0.double().clone(), rv0.double().clone()
    y64 = TF.batch_norm(x64, rm64, rv64, w64, b64, training=True, momentum=1 - KEEP, eps=EPS)
    y64.backward(dy.double())
    dims = _dims(shape)
    xd = x.double()
    mean64 = xd.mean(dims)
    var64 = ((xd - mean64.reshape(_bshape(shape))) ** 2).mean(dims)
    def add(what, got, ref, tol=TOL["float32"]):
        report.add(section, name, what, rel_err(got, ref), tol)

    add("mean", mean, mean64)
    add("var", m2 / cnt, var64)
    add("y", y, y64, tol_out)
    add("running_mean", rm, rm64)
    add("running_var", rv, rv64)
    add("dx", dx, x64.grad, tol_out)
    if affine:
        add("dweight", s2, w64.grad)
        add("dbias", s1, b64.grad)
    else:  # the sums themselves, from the float64 definition
        xhat = (xd - mean64.reshape(_bshape(shape))) / torch.sqrt(var64 + EPS).reshape(_bshape(shape))
        add("sum_dy", s1, dy.double().sum(dims))
        add("sum_dy_xhat", s2, (dy.double() * xhat).sum(dims))


def _act64(act, pre):
    """act(pre) in float64 (bn_math.h's definitions)."""
    if act == "relu":
        return pre.clamp(min=0)
    if act == "relu6":
        return pre.clamp(0, 6)
    if act == "silu":
        return pre * torch.sigmoid(pre)
    if act == "hswish":
        return pre * (pre + 3).clamp(0, 6) / 6
    return pre


def _act_grad64(act, pre, y_stored):
    """act'(pre) in float64; ReLU / ReLU6 take it from the output as stored (y64 rounded to the output dtype), as
    the kernels do (the rounding decides at 6 in float16)."""
    if act == "relu":
        return (y_stored > 0).double()
    if act == "relu6":
        return ((y_stored > 0) & (y_stored < 6)).double()
    if act == "silu":
        s = torch.sigmoid(pre)
        return s * (1 + pre * (1 - s))
    if act == "hswish":
        return torch.where(pre < -3, torch.zeros_like(pre), torch.where(pre > 3, torch.ones_like(pre),
                                                                         (2 * pre + 3) / 6))
    return torch.ones_like(pre)


def check_act_case(k, report, name, shape, dtype, layout, affine, act, with_shortcut, section="bn_act"):
    """One fused BN -> act (+ shortcut) forward and backward vs float64 (statistics from the plain kernels)."""
    forced = layout == "forced"
    x = make_input(shape, dtype, layout, seed=11)
    dy = make_input(shape, dtype, layout, offset=False, seed=12)
    sc = make_input(shape, dtype, layout, offset=False, seed=13) if with_shortcut else None
    c = shape[1]
    cnt = x.numel() // c
    w = channel(c, 3, 0.5, 1.5) if affine else None
    b = channel(c, 4) if affine else None

    mean, m2 = k.stats(x, forced)
    invstd = (m2 * (1.0 / cnt) + EPS) ** -0.5
    y = k.act_normalize(x, mean, invstd, w, b, act, shortcut=sc, force_strided=forced)
    y_arg = y if act in ("relu", "relu6") else None  # the kernels read y only for these
    s1, s2 = k.act_backward_reduce(dy, y_arg, x, mean, invstd, w, b, act, forced)
    dx, dsc = k.act_backward_elemt(dy, y_arg, x, mean, invstd, w, b, s1, s2, cnt, act, with_shortcut, forced)
    _sync()

    dims, bs = _dims(shape), _bshape(shape)
    xd, dyd = x.double(), dy.double()
    mean64 = xd.mean(dims)
    invstd64 = 1.0 / torch.sqrt(((xd - mean64.reshape(bs)) ** 2).mean(dims) + EPS)
    xhat = (xd - mean64.reshape(bs)) * invstd64.reshape(bs)
    w64 = w.double() if affine else torch.ones(c, dtype=torch.float64, device=DEVICE)
    b64 = b.double() if affine else torch.zeros(c, dtype=torch.float64, device=DEVICE)
    pre = xhat * w64.reshape(bs) + b64.reshape(bs) + (sc.double() if with_shortcut else 0.0)
    y64 = _act64(act, pre)
    dz = dyd * _act_grad64(act, pre, y64.to(getattr(torch, dtype)))
    sum_dz, sum_dz_xhat = dz.sum(dims), (dz * xhat).sum(dims)
    dx64 = (w64 * invstd64).reshape(bs) * (dz - (sum_dz / cnt).reshape(bs) - xhat * (sum_dz_xhat / cnt).reshape(bs))

    def add(what, got, ref, tol=TOL["float32"]):
        report.add(section, name, what, rel_err(got, ref), tol)

    add("y", y, y64, TOL[dtype])
    add("sum_dz (dbias)", s1, sum_dz)
    add("sum_dz_xhat (dweight)", s2, sum_dz_xhat)
    add("dx", dx, dx64, TOL[dtype])
    if with_shortcut:
        add("dshortcut", dsc, dz, TOL[dtype])


def check_merge(k, report, name, shape, dtype, sizes):
    """SyncBN on shards: per-shard kernels, rows merged as the all-gather path does, vs the whole batch."""
    assert sum(sizes) == shape[0]
    x = make_input(shape, dtype, "contiguous", seed=7)
    dy = make_input(shape, dtype, "contiguous", offset=False, seed=8)
    c = shape[1]
    w, b = channel(c, 3, 0.5, 1.5), channel(c, 4)
    rows, shards = [], []
    for lo, hi in shard_bounds(sizes):
        xs, dys = x[lo:hi], dy[lo:hi]
        mean, m2 = k.stats(xs)  # an empty shard: zeros (the kernels' contract), and count 0 in its row
        rows.append(pack_row(xs.numel() // c, mean.cpu().numpy(), m2.cpu().numpy()))
        shards.append((xs, dys))
    batch = merge_rows(np.stack(rows), c)
    mean32 = torch.tensor(batch.mean, dtype=torch.float32, device=DEVICE)
    invstd32 = torch.tensor(1.0 / np.sqrt(batch.m2 / batch.count + EPS), dtype=torch.float32, device=DEVICE)
    ys, sums = [], []
    for xs, dys in shards:
        if xs.numel():
            ys.append(k.normalize(xs, mean32, invstd32, w, b))
        s1, s2 = k.backward_reduce(dys, xs, mean32, invstd32)
        sums.append(torch.cat([s1, s2]).cpu().numpy())
    total = torch.tensor(all_reduce_sum(sums), device=DEVICE)
    dxs = [k.backward_elemt(dys, xs, mean32, invstd32, w, total[:c], total[c:], batch.count)
           for xs, dys in shards if xs.numel()]
    _sync()

    x64 = x.double().requires_grad_(True)
    w64, b64 = w.double().requires_grad_(True), b.double().requires_grad_(True)
    rm64, rv64 = torch.zeros(c, dtype=torch.float64, device=DEVICE), torch.ones(c, dtype=torch.float64, device=DEVICE)
    y64 = TF.batch_norm(x64, rm64, rv64, w64, b64, training=True, momentum=1 - KEEP, eps=EPS)
    y64.backward(dy.double())
    dims = _dims(shape)

    def add(what, got, ref, tol=TOL["float32"]):
        report.add("syncbn_merge", name, what, rel_err(got, ref), tol)

    add("count", np.array([batch.count]), np.array([x.numel() // c]), 0.0)
    xd = x.double()
    mean64 = xd.mean(dims)
    add("mean", batch.mean, mean64)
    add("var", batch.m2 / batch.count, ((xd - mean64.reshape(_bshape(shape))) ** 2).mean(dims))
    add("running_var", (1 - KEEP) * batch.m2 / (batch.count - 1) + KEEP, rv64)
    add("y", torch.cat(ys), y64, TOL[dtype])
    add("dx", torch.cat(dxs), x64.grad, TOL[dtype])
    add("dweight", total[c:], w64.grad)
    add("dbias", total[:c], b64.grad)


def guarded(report, section, name, fn, *args):
    """``fn(*args)``; a CUDA error (or any exception) becomes a failed row instead of ending the run."""
    try:
        fn(*args)
    except Exception as exc:  # noqa: BLE001
        report.add(section, name, f"raised {type(exc).__name__}: {str(exc).splitlines()[0][:200]}", float("inf"), 0.0)
        if torch is not None:
            _sync()  # (a sticky CUDA error raises here and ends the run: nothing more can run)


# ----------------------------------------------------------------------------------- timing
def _cuda_ms(fn, iters, warmup=3):
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


GRAPH_CALLS = 10  # calls of fn captured in one CUDA graph


def _graph_ms(fn, iters):
    """ms per call of ``fn`` replayed from a CUDA graph of GRAPH_CALLS calls: the GPU's time without the
    Python / launch cost per kernel (NaN when capture fails)."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(GRAPH_CALLS):
                fn()
    except Exception as exc:  # noqa: BLE001
        print(f"  (graph capture failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]})")
        torch.cuda.synchronize()
        return float("nan")
    return _cuda_ms(graph.replay, max(1, iters // GRAPH_CALLS)) / GRAPH_CALLS


def measure(fns, iters):
    """{basebn,torch}_{fwd,bwd}_ms for the four functions (ours_fwd, torch_fwd, ours_bwd, torch_bwd): eager calls
    (Python + launches included) and, under the same names with ``graph_``, CUDA-graph replays."""
    names = ("basebn_fwd_ms", "torch_fwd_ms", "basebn_bwd_ms", "torch_bwd_ms")
    row = {name: _cuda_ms(fn, iters) for name, fn in zip(names, fns)}
    row.update({"graph_" + name: _graph_ms(fn, iters) for name, fn in zip(names, fns)})
    return row


TABLE_HEAD = (f"{'shape':22s} {'dtype':8s} | graph: {'basebn fwd':>10s} {'torch fwd':>9s} {'basebn bwd':>10s} "
              f"{'torch bwd':>9s} {'fwd x':>6s} {'bwd x':>6s} | eager: {'fwd x':>6s} {'bwd x':>6s}")


def format_row(shape, dtype, r):
    def ratio(prefix, what):
        return r[f"{prefix}basebn_{what}_ms"] / r[f"{prefix}torch_{what}_ms"]
    return (f"{str(shape):22s} {dtype:8s} | graph: {r['graph_basebn_fwd_ms']:10.4f} {r['graph_torch_fwd_ms']:9.4f} "
            f"{r['graph_basebn_bwd_ms']:10.4f} {r['graph_torch_bwd_ms']:9.4f} {ratio('graph_', 'fwd'):6.2f} "
            f"{ratio('graph_', 'bwd'):6.2f} | eager: {ratio('', 'fwd'):6.2f} {ratio('', 'bwd'):6.2f}")


def layer_functions(k, shape, dtype, relu=False, with_shortcut=False):
    """(ours_fwd, torch_fwd, ours_bwd, torch_bwd) for one BN layer of ``shape``: plain BN through the plain C API,
    or (``relu``) BN -> ReLU / BN -> add -> ReLU through the fused one."""
    x = make_input(shape, dtype, "contiguous", seed=1)
    dy = make_input(shape, dtype, "contiguous", offset=False, seed=2)
    sc = make_input(shape, dtype, "contiguous", offset=False, seed=3) if with_shortcut else None
    c, cnt = shape[1], x.numel() // shape[1]
    w, b, rm, rv = channel(c, 3, 0.5, 1.5), channel(c, 4), torch.zeros(c, device=DEVICE), torch.ones(c, device=DEVICE)
    state = {}

    def ours_fwd():
        mean, m2 = k.stats(x)
        invstd = (m2 * (1.0 / cnt) + EPS).rsqrt()
        if relu:
            state["y"] = k.act_normalize(x, mean, invstd, w, b, "relu", shortcut=sc)
        else:
            state["y"] = k.normalize(x, mean, invstd, w, b)
        rm.mul_(KEEP).add_(mean, alpha=1 - KEEP)
        rv.mul_(KEEP).add_(m2, alpha=(1 - KEEP) / (cnt - 1))
        state["mean"], state["invstd"] = mean, invstd

    def ours_bwd():
        y, mean, invstd = state["y"], state["mean"], state["invstd"]
        if relu:
            s1, s2 = k.act_backward_reduce(dy, y, x, mean, invstd, w, b, "relu")
            k.act_backward_elemt(dy, y, x, mean, invstd, w, b, s1, s2, cnt, "relu", with_shortcut)
        else:
            s1, s2 = k.backward_reduce(dy, x, mean, invstd)
            k.backward_elemt(dy, x, mean, invstd, w, s1, s2, cnt)

    trm, trv = rm.clone(), rv.clone()

    def torch_layer(xin, win, bin_, scin):
        z = TF.batch_norm(xin, trm, trv, win, bin_, training=True, momentum=1 - KEEP, eps=EPS)
        if scin is not None:
            z = z + scin
        return torch.relu_(z) if relu else z

    def torch_fwd():
        with torch.no_grad():
            torch_layer(x, w, b, sc)

    xt, tw, tb = x.clone().requires_grad_(True), w.clone().requires_grad_(True), b.clone().requires_grad_(True)
    sct = sc.clone().requires_grad_(True) if with_shortcut else None
    yt = torch_layer(xt, tw, tb, sct)
    inputs = (xt, tw, tb) + ((sct,) if with_shortcut else ())

    def torch_bwd():
        torch.autograd.grad(yt, inputs, dy, retain_graph=True)

    ours_fwd()
    return ours_fwd, torch_fwd, ours_bwd, torch_bwd


def timing_table(k, iters):
    """Rows of the timing table (dicts), printed as they come."""
    print(f"\n## timing: ms per BN layer (CUDA events; graph: {GRAPH_CALLS} calls per CUDA graph replayed, the GPU's "
          f"time; eager: Python + launches, mean of {iters}); torch = torch.nn.functional.batch_norm (cuDNN "
          f"{torch.backends.cudnn.version()} when torch picks it)")
    print(f"{'set':8s} {TABLE_HEAD}")
    rows = []
    for label, shapes in (("zoo", ZOO_SHAPES), ("resnet50", RESNET50_SHAPES)):
        for shape in shapes:
            for dtype in ("float32", "float16"):
                r = measure(layer_functions(k, shape, dtype), iters)
                rows.append(dict(set=label, shape=list(shape), dtype=dtype, **r))
                print(f"{label:8s} {format_row(shape, dtype, r)}", flush=True)
    return rows


def act_timing_table(k, iters):
    """Rows of the fused timing table (dicts): BN-ReLU and BN-add-ReLU, ResNet-50's shapes."""
    print("\n## timing: fused BN-ReLU / BN-add-ReLU vs torch batch_norm -> (add ->) relu_, ms (as above)")
    print(f"{'op':12s} {TABLE_HEAD}")
    rows = []
    for shape in RESNET50_SHAPES:
        for dtype in ("float32", "float16"):
            for op, with_shortcut in (("bn-relu", False), ("bn-add-relu", True)):
                r = measure(layer_functions(k, shape, dtype, True, with_shortcut), iters)
                rows.append(dict(set=op, shape=list(shape), dtype=dtype, **r))
                print(f"{op:12s} {format_row(shape, dtype, r)}", flush=True)
    return rows


# ------------------------------------------------------------------------------------ driver
def results_figures(checks, timing):
    """A run's figures in results/cuda_bn.json's layout from the check rows and the timing rows: checks_passed
    [passed, total]; per size class (H >= 56, H <= 28), the min-max of basebn / torch CUDA-graph ms over the
    shapes and dtypes: ``forward`` / ``backward`` (plain BN, ResNet-50's shapes), ``fused_forward`` /
    ``fused_backward`` (BN-ReLU and BN-add-ReLU)."""
    figures = {"checks_passed": [sum(1 for r in checks if r["ok"]), len(checks)]}
    classes = {"cudnn_ratio_56_and_larger": lambda h: h >= 56, "cudnn_ratio_28_and_smaller": lambda h: h <= 28}
    for key, size_class in classes.items():
        spans = {}
        for row in timing:
            if row["set"] == "zoo" or len(row["shape"]) < 3 or not size_class(row["shape"][2]):
                continue
            prefix = "" if row["set"] == "resnet50" else "fused_"
            for what in ("fwd", "bwd"):
                ratio = row[f"graph_basebn_{what}_ms"] / row[f"graph_torch_{what}_ms"]
                if ratio == ratio:  # NaN when a graph capture failed
                    spans.setdefault(prefix + {"fwd": "forward", "bwd": "backward"}[what], []).append(ratio)
        if spans:
            figures[key] = {k: {"min": round(min(v), 3), "max": round(max(v), 3)} for k, v in spans.items()}
    return figures


def _versions(nvcc):
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.strip().splitlines()
    return out[-1] if out else "?"


def main(argv=None):
    """Compile, check, time (see the module docstring); returns the exit code."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[2])
    p.add_argument("--quick", action="store_true", help="leave out the huge cases")
    p.add_argument("--no-timing", action="store_true", help="leave out the timing table")
    p.add_argument("--iters", type=int, default=50, help="timed iterations per measurement")
    p.add_argument("--arch", action="append", help="sm number(s) to compile for (default: the GPU's, "
                   f"or {'/'.join(COMPILE_ONLY_ARCHS)} without one)")
    p.add_argument("--build-dir", default=os.path.join(tempfile.gettempdir(), "basebn_cuda_harness"))
    p.add_argument("--json", help="also write the results to this file")
    add_results_argument(p)
    args = p.parse_args(argv)
    result = {"compile": None, "checks": [], "timing": [], "skipped": None}

    def finish(code, skipped=None):
        result["skipped"] = skipped
        if skipped:
            print(f"skip: {skipped}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
        return code

    nvcc = find_nvcc()
    if nvcc is None:
        return finish(0, "nvcc not found ($NVCC, PATH, $CUDA_HOME/bin, /usr/local/cuda/bin): nothing compiled or run")
    gpu = torch is not None and torch.cuda.is_available()
    archs = args.arch or (["%d%d" % torch.cuda.get_device_capability()] if gpu else list(COMPILE_ONLY_ARCHS))
    t0 = time.time()
    try:
        so = build_library(nvcc, archs, args.build_dir)
    except RuntimeError as exc:
        print(f"FAIL compile: {exc}")
        result["compile"] = {"ok": False, "error": str(exc)}
        return finish(1)
    result["compile"] = {"ok": True, "library": so, "archs": archs, "nvcc": _versions(nvcc)}
    print(f"compile: ok, sm_{'/sm_'.join(archs)} with {_versions(nvcc)} in {time.time() - t0:.0f} s -> {so}")
    if torch is None:
        return finish(0, "PyTorch is not installed: GPU checks and timing not run (compile-only check done)")
    if not gpu:
        return finish(0, "torch.cuda.is_available() is False (no GPU or driver): GPU checks and timing not run "
                         "(compile-only check done)")
    print(f"device: {torch.cuda.get_device_name()} (sm_{archs[0]}), torch {torch.__version__}, "
          f"CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}")
    k = CudaBnKernels(so, torch)
    report = Report()
    print("\n## batch_norm vs torch float64 (forward, running stats, backward)")
    for case in CASES + ([] if args.quick else HUGE_CASES):
        guarded(report, "batch_norm", case[0], check_case, k, report, *case)
    report.print_case_summary("batch_norm")
    print("\n## fused BN -> activation (+ shortcut) vs float64")
    for case in ACT_CASES:
        guarded(report, "bn_act", case[0], check_act_case, k, report, *case)
    report.print_case_summary("bn_act")
    print("\n## SyncBN: per-shard stats merged as the all-gather path does, vs the whole batch")
    for case in MERGE_CASES:
        guarded(report, "syncbn_merge", case[0], check_merge, k, report, *case)
    report.print_case_summary("syncbn_merge")
    result["checks"] = report.rows
    failures = report.failures()
    print(f"\n{len(report.rows) - len(failures)}/{len(report.rows)} checks passed")
    if not args.no_timing:
        result["timing"] = timing_table(k, args.iters) + act_timing_table(k, args.iters)
    save_run(args.results, "benchmarks/cuda/run_harness.py", "cuda", [], results_figures(report.rows,
                                                                                      result["timing"]),
             "the CUDA BN kernels on a GPU (standalone harness, no MegEngine) against float64 PyTorch and cuDNN",
             conditions=f"{torch.cuda.get_device_name()}, CUDA-graph time, {args.iters} iterations per measurement; "
                        f"CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}",
             torch_python=sys.executable, argv=argv)
    return finish(1 if failures else 0)


if __name__ == "__main__":
    sys.exit(main())
