"""Which convolution backend should basebn's CPU conv custom op use? Measure, op by op.

Backends, each doing conv forward (fwd), backward-data (bwd-data) and backward-weights (bwd-w)
on NCHW float32 tensors:

    dnnl      oneDNN (pip `onednn-cpu-gomp` + `onednn-devel-cpu-gomp`, OpenMP runtime) through a
              small C++ harness (g++ -O3, ctypes): primitives created with format_tag::any, kept in
              a cache keyed by shape/op, reorders NCHW <-> internal layout counted in the time
    dnnl-nchw the same oneDNN harness with plain nchw/oihw descriptors (no reorders, oneDNN's
              gemm-based kernels)
    dnnl2026  oneDNN 3.13 from pip `onednn` + `onednn-devel` 2026.1 (SYCL CPU runtime, TBB; pulls
              ~2 GB of DPC++/OpenCL runtimes; 2 threads = all cores only). Not in the default
              list: ask for it with --backends ... dnnl2026
    blas      im2col / col2im + sgemm on OpenBLAS (pip `scipy-openblas32`), same harness style,
              OpenMP over the images of the batch, single-threaded sgemm per image
    mkl       the same im2col code on oneMKL (pip `mkl`, `mkl-include`, sequential; ~1 GB)
    mge       MegEngine 1.13's own CPU conv: Convolution, ConvolutionBackwardData and
              ConvolutionBackwardFilter (the ops GradManager runs for F.conv2d), on
              `cpu0` (1 thread) or `multithread2:0` (2 threads)
    basebn    basebn's old path (now the fallback without oneDNN): MegEngine fwd and bwd-data, numpy
              `conv_weight_grad` for bwd-w
    basebn-op basebn's oneDNN custom ops (basebn/ops/csrc/conv_dnnl.cpp) called through MegEngine
              (basebn.ops.conv_ops): the `dnnl` harness's code plus MegEngine's tensor <-> custom-op
              boundary, its queue sync and the copy of the result to numpy; threads by $BASEBN_NUM_THREADS
    torch     PyTorch CPU (reference; its CPU convs are oneDNN), in its own venv/process, driven
              over a pipe so that its runs interleave with the others

All outputs are checked against MegEngine's (max |a-b| / max |b| printed). Timing: after one
warm-up call, rounds go A B C ... A B C ...; the median per (shape, op, backend) is reported with
its ratio to torch (or to mge when torch is absent). The "ResNet-20 step" line sums, over every
conv of a ResNet-20 width-16 step (1x28x28, batch 128), fwd + bwd-data + bwd-w (no bwd-data for
the stem), weighted by how often each shape occurs.

Dependencies go to ~/.cache/basebn/bench (``$BASEBN_BENCH_CACHE``), installed with pip on first
use; a backend that cannot be installed/built is skipped with the reason. PyTorch's PyPI wheel
pulls the CUDA libraries (~5 GB installed): it is only installed with --install-torch, or pass
--torch-python PATH to a python that has torch.

    .venv/bin/python benchmarks/bench_conv_backends.py [--quick] [--threads 2 1] [--rounds 5]
        [--results results/conv_backends.json]

Results and the choice made from them: docs/conv_backends.md. ``--results FILE`` appends the medians per shape
and op (``per_shape_ms``) and the ResNet-20 step's convs per thread count, fewest threads first
(``resnet20_step_convs_ms``; ``resnet20_step_convs_ms_partial`` when --quick or --shapes leave some out).
"""
import argparse
import ctypes
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from results_file import add_results_argument, save_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

CACHE = os.path.abspath(os.environ.get("BASEBN_BENCH_CACHE")
                        or os.path.join(os.path.expanduser("~"), ".cache", "basebn", "bench"))
ONEDNN_PKGS = ("onednn-cpu-gomp==2023.2.0", "onednn-devel-cpu-gomp==2023.2.0")
# oneDNN 2026.1's wheels are built for SYCL (CPU engine = SYCL CPU device through Intel's OpenCL CPU
# runtime, TBB threading); they pull ~2 GB of DPC++/OpenCL runtimes
ONEDNN_SYCL_PKGS = ("onednn==2026.1.0", "onednn-devel==2026.1.0")
OPENBLAS_PKG = "scipy-openblas32"
OPS = ("fwd", "bwd-data", "bwd-w")

# (name, N, C, H, W, O, k, stride, pad, groups, uses in one ResNet-20 step (0: not ResNet-20))
SHAPES = [
    ("r20 stem 1-16", 128, 1, 28, 28, 16, 3, 1, 1, 1, 1),
    ("r20 16-16", 128, 16, 28, 28, 16, 3, 1, 1, 1, 6),
    ("r20 16-32 s2", 128, 16, 28, 28, 32, 3, 2, 1, 1, 1),
    ("r20 32-32", 128, 32, 14, 14, 32, 3, 1, 1, 1, 5),
    ("r20 32-64 s2", 128, 32, 14, 14, 64, 3, 2, 1, 1, 1),
    ("r20 64-64", 128, 64, 7, 7, 64, 3, 1, 1, 1, 5),
    ("r20 ds 16-32 1x1s2", 128, 16, 28, 28, 32, 1, 2, 0, 1, 1),
    ("r20 ds 32-64 1x1s2", 128, 32, 14, 14, 64, 1, 2, 0, 1, 1),
    ("r18 stem 7x7s2", 32, 3, 112, 112, 64, 7, 2, 3, 1, 0),
    ("r18 64-64", 32, 64, 28, 28, 64, 3, 1, 1, 1, 0),
    ("r18 64-128 s2", 32, 64, 28, 28, 128, 3, 2, 1, 1, 0),
    ("r18 128-128", 32, 128, 14, 14, 128, 3, 1, 1, 1, 0),
    ("r18 ds 64-128 1x1s2", 32, 64, 28, 28, 128, 1, 2, 0, 1, 0),
    ("r18 128-256 s2", 32, 128, 14, 14, 256, 3, 2, 1, 1, 0),
    ("r18 256-256", 32, 256, 7, 7, 256, 3, 1, 1, 1, 0),
    ("r18 ds 128-256 1x1s2", 32, 128, 14, 14, 256, 1, 2, 0, 1, 0),
    ("r18 256-512 s2", 32, 256, 7, 7, 512, 3, 2, 1, 1, 0),
    ("r18 512-512", 32, 512, 4, 4, 512, 3, 1, 1, 1, 0),
    ("r18 ds 256-512 1x1s2", 32, 256, 7, 7, 512, 1, 2, 0, 1, 0),
    ("mbv2 dw 144 3x3", 32, 144, 56, 56, 144, 3, 1, 1, 144, 0),
    ("mbv2 pw 144-24 1x1", 32, 144, 56, 56, 24, 1, 1, 0, 1, 0),
]
QUICK = {"r20 stem 1-16", "r20 16-16", "r20 16-32 s2", "r20 32-32", "r20 32-64 s2", "r20 64-64",
         "r20 ds 16-32 1x1s2", "r20 ds 32-64 1x1s2", "r18 64-64", "mbv2 dw 144 3x3", "mbv2 pw 144-24 1x1"}


def out_hw(h, k, s, p, d=1):
    return (h + 2 * p - d * (k - 1) - 1) // s + 1


def params(shape):
    """int32[16]: N C H W O KH KW SH SW PH PW DH DW G HO WO (the harness ABI)."""
    _, n, c, h, w, o, k, s, p, g, _ = shape
    return [n, c, h, w, o, k, k, s, s, p, p, 1, 1, g, out_hw(h, k, s, p), out_hw(w, k, s, p)]


# ----------------------------------------------------------------------------- C++ harnesses
COMMON_CPP = r"""
#include <cstdio>
#include <cstring>
#include <vector>
#include <map>
#ifdef _OPENMP
#include <omp.h>
#endif
#define P_N p[0]
#define P_C p[1]
#define P_H p[2]
#define P_W p[3]
#define P_O p[4]
#define P_KH p[5]
#define P_KW p[6]
#define P_SH p[7]
#define P_SW p[8]
#define P_PH p[9]
#define P_PW p[10]
#define P_DH p[11]
#define P_DW p[12]
#define P_G p[13]
#define P_HO p[14]
#define P_WO p[15]
extern "C" int harness_threads(int t) {
#ifdef _OPENMP
    if (t > 0) omp_set_num_threads(t);
    return omp_get_max_threads();
#else
    return 1;
#endif
}
"""

DNNL_CPP = COMMON_CPP + r"""
#include <oneapi/dnnl/dnnl.hpp>
using namespace dnnl;
using tag = memory::format_tag;
using dt = memory::data_type;

static engine& eng() { static engine e(engine::kind::cpu, 0); return e; }
static stream& strm() { static stream s(eng()); return s; }

struct Slot {            // one user-visible NCHW/oihw tensor and, if the primitive wants another
    memory::desc user;   // layout, the internal buffer and the reorder to/from it
    memory::desc want;
    bool reo = false;
    memory internal;
    primitive r;
    int arg;
};
struct Entry { primitive prim; Slot a, b, c; std::string impl; };
static std::map<std::vector<int>, Entry*> cache;

static Slot make_slot(const memory::desc& user, const memory::desc& want, int arg, bool is_out) {
    Slot s; s.user = user; s.want = want; s.arg = arg; s.reo = !(user == want);
    if (s.reo) {
        s.internal = memory(want, eng());
        if (is_out) s.r = reorder(reorder::primitive_desc(eng(), want, eng(), user));
        else s.r = reorder(reorder::primitive_desc(eng(), user, eng(), want));
    }
    return s;
}

static Entry* get(int op, const int* p) {
    std::vector<int> key(p, p + 16); key.push_back(op);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    int G = P_G;
    memory::dims xd = {P_N, P_C, P_H, P_W}, yd = {P_N, P_O, P_HO, P_WO};
    memory::dims wd = G == 1 ? memory::dims{P_O, P_C, P_KH, P_KW}
                             : memory::dims{G, P_O / G, P_C / G, P_KH, P_KW};
    memory::dims st = {P_SH, P_SW}, dl = {P_DH - 1, P_DW - 1}, pl = {P_PH, P_PW};
    memory::dims pr = {(P_HO - 1) * P_SH + (P_KH - 1) * P_DH + 1 - P_H - P_PH,
                       (P_WO - 1) * P_SW + (P_KW - 1) * P_DW + 1 - P_W - P_PW};
    memory::desc xu(xd, dt::f32, tag::nchw), yu(yd, dt::f32, tag::nchw),
        wu(wd, dt::f32, G == 1 ? tag::oihw : tag::goihw);
#ifdef PLAIN_LAYOUT  // user layouts for the primitive too: no reorders, but oneDNN's slower plain-layout kernels
    memory::desc xa = xu, ya = yu, wa = wu;
#else
    memory::desc xa(xd, dt::f32, tag::any), ya(yd, dt::f32, tag::any), wa(wd, dt::f32, tag::any);
#endif
    auto fpd = convolution_forward::primitive_desc(eng(), prop_kind::forward_training,
        algorithm::convolution_direct, xa, wa, ya, st, dl, pl, pr);
    Entry* e = new Entry();
    if (op == 0) {
        e->prim = convolution_forward(fpd);
        e->a = make_slot(xu, fpd.src_desc(), DNNL_ARG_SRC, false);
        e->b = make_slot(wu, fpd.weights_desc(), DNNL_ARG_WEIGHTS, false);
        e->c = make_slot(yu, fpd.dst_desc(), DNNL_ARG_DST, true);
        e->impl = fpd.impl_info_str();
    } else if (op == 1) {
        auto bpd = convolution_backward_data::primitive_desc(eng(), algorithm::convolution_direct,
            xa, wa, ya, st, dl, pl, pr, fpd);
        e->prim = convolution_backward_data(bpd);
        e->a = make_slot(yu, bpd.diff_dst_desc(), DNNL_ARG_DIFF_DST, false);
        e->b = make_slot(wu, bpd.weights_desc(), DNNL_ARG_WEIGHTS, false);
        e->c = make_slot(xu, bpd.diff_src_desc(), DNNL_ARG_DIFF_SRC, true);
        e->impl = bpd.impl_info_str();
    } else {
        auto wpd = convolution_backward_weights::primitive_desc(eng(), algorithm::convolution_direct,
            xa, wa, ya, st, dl, pl, pr, fpd);
        e->prim = convolution_backward_weights(wpd);
        e->a = make_slot(xu, wpd.src_desc(), DNNL_ARG_SRC, false);
        e->b = make_slot(yu, wpd.diff_dst_desc(), DNNL_ARG_DIFF_DST, false);
        e->c = make_slot(wu, wpd.diff_weights_desc(), DNNL_ARG_DIFF_WEIGHTS, true);
        e->impl = wpd.impl_info_str();
    }
    cache[key] = e;
    return e;
}

// op 0: a=x, b=w -> c=y;  op 1: a=dy, b=w -> c=dx;  op 2: a=x, b=dy -> c=dw
extern "C" int conv(int op, const int* p, const float* a, const float* b, float* c) {
    try {
        Entry* e = get(op, p);
        memory ua(e->a.user, eng(), (void*)a), ub(e->b.user, eng(), (void*)b), uc(e->c.user, eng(), c);
        memory ma = ua, mb = ub, mc = uc;
        if (e->a.reo) { e->a.r.execute(strm(), {{DNNL_ARG_FROM, ua}, {DNNL_ARG_TO, e->a.internal}}); ma = e->a.internal; }
        if (e->b.reo) { e->b.r.execute(strm(), {{DNNL_ARG_FROM, ub}, {DNNL_ARG_TO, e->b.internal}}); mb = e->b.internal; }
        if (e->c.reo) mc = e->c.internal;
        e->prim.execute(strm(), {{e->a.arg, ma}, {e->b.arg, mb}, {e->c.arg, mc}});
        if (e->c.reo) e->c.r.execute(strm(), {{DNNL_ARG_FROM, e->c.internal}, {DNNL_ARG_TO, uc}});
        strm().wait();
        return 0;
    } catch (dnnl::error& err) {
        fprintf(stderr, "dnnl error: %s (status %d)\n", err.what(), (int)err.status);
        return 1;
    }
}
extern "C" int conv_impl(int op, const int* p, char* buf, int len) {
    try {
        Entry* e = get(op, p);
        std::string s = e->impl + (e->a.reo ? " +reorder(in0)" : "") + (e->b.reo ? " +reorder(in1)" : "")
            + (e->c.reo ? " +reorder(out)" : "");
        snprintf(buf, len, "%s", s.c_str());
        return 0;
    } catch (dnnl::error& err) { snprintf(buf, len, "error: %s", err.what()); return 1; }
}
"""

BLAS_CPP = COMMON_CPP + r"""
#ifdef USE_MKL
#include <mkl_cblas.h>
#define BLAS_NAME "oneMKL, sequential"
static void blas_one_thread() {}  // MKL_THREADING_LAYER=SEQUENTIAL is set before loading
#else
#include <cblas.h>
#define cblas_sgemm scipy_cblas_sgemm
#define BLAS_NAME "OpenBLAS"
extern "C" void scipy_openblas_set_num_threads(int);
static void blas_one_thread() { scipy_openblas_set_num_threads(1); }
#endif

static void im2col(const float* x, int C, int H, int W, const int* p, float* col) {
    int HO = P_HO, WO = P_WO;
    for (int c = 0; c < C; ++c)
        for (int i = 0; i < P_KH; ++i)
            for (int j = 0; j < P_KW; ++j) {
                float* dst = col + ((size_t)(c * P_KH + i) * P_KW + j) * HO * WO;
                for (int oh = 0; oh < HO; ++oh) {
                    int ih = oh * P_SH - P_PH + i * P_DH;
                    float* d = dst + oh * WO;
                    if (ih < 0 || ih >= H) { memset(d, 0, sizeof(float) * WO); continue; }
                    const float* s = x + ((size_t)c * H + ih) * W;
                    for (int ow = 0; ow < WO; ++ow) {
                        int iw = ow * P_SW - P_PW + j * P_DW;
                        d[ow] = (iw >= 0 && iw < W) ? s[iw] : 0.f;
                    }
                }
            }
}
static void col2im(const float* col, int C, int H, int W, const int* p, float* x) {
    int HO = P_HO, WO = P_WO;
    memset(x, 0, sizeof(float) * (size_t)C * H * W);
    for (int c = 0; c < C; ++c)
        for (int i = 0; i < P_KH; ++i)
            for (int j = 0; j < P_KW; ++j) {
                const float* src = col + ((size_t)(c * P_KH + i) * P_KW + j) * HO * WO;
                for (int oh = 0; oh < HO; ++oh) {
                    int ih = oh * P_SH - P_PH + i * P_DH;
                    if (ih < 0 || ih >= H) continue;
                    float* d = x + ((size_t)c * H + ih) * W;
                    const float* s = src + oh * WO;
                    for (int ow = 0; ow < WO; ++ow) {
                        int iw = ow * P_SW - P_PW + j * P_DW;
                        if (iw >= 0 && iw < W) d[iw] += s[ow];
                    }
                }
            }
}

// op 0: a=x, b=w -> c=y;  op 1: a=dy, b=w -> c=dx;  op 2: a=x, b=dy -> c=dw
extern "C" int conv(int op, const int* p, const float* a, const float* b, float* c) {
    blas_one_thread();
    const int N = P_N, C = P_C, H = P_H, W = P_W, O = P_O, G = P_G, Cg = C / G, Og = O / G;
    const int HWo = P_HO * P_WO, K = Cg * P_KH * P_KW;
    const bool direct = P_KH == 1 && P_KW == 1 && P_SH == 1 && P_SW == 1 && P_PH == 0 && P_PW == 0;
    const size_t xs = (size_t)C * H * W, ys = (size_t)O * HWo, wsz = (size_t)O * K;
    int nt = harness_threads(0);
    std::vector<float> dwpart(op == 2 ? wsz * nt : 0, 0.f);
    #pragma omp parallel
    {
        int t = 0;
#ifdef _OPENMP
        t = omp_get_thread_num();
#endif
        std::vector<float> colbuf(direct ? 0 : (size_t)K * HWo);
        std::vector<float> dxcol(op == 1 && !direct ? (size_t)G * K * HWo : 0);
        #pragma omp for schedule(static)
        for (int n = 0; n < N; ++n) {
            for (int g = 0; g < G; ++g) {
                if (op == 0) {
                    const float* x = a + n * xs + (size_t)g * Cg * H * W;
                    const float* col = x;
                    if (!direct) { im2col(x, Cg, H, W, p, colbuf.data()); col = colbuf.data(); }
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, Og, HWo, K, 1.f,
                                b + (size_t)g * Og * K, K, col, HWo, 0.f, c + n * ys + (size_t)g * Og * HWo, HWo);
                } else if (op == 1) {
                    float* col = direct ? c + n * xs + (size_t)g * Cg * H * W : dxcol.data() + (size_t)g * K * HWo;
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, K, HWo, Og, 1.f,
                                b + (size_t)g * Og * K, K, a + n * ys + (size_t)g * Og * HWo, HWo, 0.f, col, HWo);
                } else {
                    const float* x = a + n * xs + (size_t)g * Cg * H * W;
                    const float* col = x;
                    if (!direct) { im2col(x, Cg, H, W, p, colbuf.data()); col = colbuf.data(); }
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, Og, K, HWo, 1.f,
                                b + n * ys + (size_t)g * Og * HWo, HWo, col, HWo, 1.f,
                                dwpart.data() + t * wsz + (size_t)g * Og * K, K);
                }
            }
            if (op == 1 && !direct)
                for (int g = 0; g < G; ++g)
                    col2im(dxcol.data() + (size_t)g * K * HWo, Cg, H, W, p, c + n * xs + (size_t)g * Cg * H * W);
        }
    }
    if (op == 2) {
        for (size_t i = 0; i < wsz; ++i) {
            float s = 0.f;
            for (int t = 0; t < nt; ++t) s += dwpart[t * wsz + i];
            c[i] = s;
        }
    }
    return 0;
}
extern "C" int conv_impl(int, const int*, char* buf, int len) {
    snprintf(buf, len, "im2col+sgemm(" BLAS_NAME "), omp over images");
    return 0;
}
"""


def pip_install(args, log):
    cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "-q"] + list(args)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed: {r.stderr.strip()[-400:]}")
    log(f"installed: {' '.join(args)}")


def ensure_onednn(log):
    """Prefix with include/ and lib/libdnnl.so of oneDNN 3.2 (CPU, OpenMP runtime)."""
    prefix = os.path.join(CACHE, "onednn-cpu-gomp")
    if not os.path.exists(os.path.join(prefix, "lib", "libdnnl.so")):
        # --prefix, not --target: the wheels put libdnnl.so in <prefix>/lib as data files
        pip_install(["--prefix", prefix, "--no-warn-script-location"] + list(ONEDNN_PKGS), log)
    if not os.path.exists(os.path.join(prefix, "include", "oneapi", "dnnl", "dnnl.hpp")):
        raise RuntimeError(f"no oneapi/dnnl/dnnl.hpp under {prefix}/include")
    return os.path.join(prefix, "include"), os.path.join(prefix, "lib"), "dnnl"


def ensure_onednn_sycl(log):
    """Prefix of oneDNN 2026.1 (SYCL runtime); sets OCL_ICD_FILENAMES to its OpenCL CPU runtime."""
    prefix = os.path.join(CACHE, "onednn-sycl")
    lib = os.path.join(prefix, "lib")
    if not os.path.exists(os.path.join(lib, "libdnnl.so")):
        pip_install(["--prefix", prefix, "--no-warn-script-location"] + list(ONEDNN_SYCL_PKGS), log)
    ocl = sorted(f for f in os.listdir(lib) if f.startswith("libintelocl.so.") and f[-1].isdigit())
    if not ocl:
        raise RuntimeError(f"no libintelocl.so.* (OpenCL CPU runtime) in {lib}")
    # without it: "SYCL cpu devices queried but not found" (the wheel's ICD file names a conda path)
    os.environ["OCL_ICD_FILENAMES"] = os.path.join(lib, ocl[-1])
    return os.path.join(prefix, "include"), lib, "dnnl"


def ensure_openblas(log):
    target = os.path.join(CACHE, "openblas")
    pkg = os.path.join(target, "scipy_openblas32")
    if not os.path.exists(os.path.join(pkg, "lib", "libscipy_openblas.so")):
        pip_install(["--target", target, OPENBLAS_PKG], log)
    return os.path.join(pkg, "include"), os.path.join(pkg, "lib"), "scipy_openblas"


def ensure_mkl(log):
    """Prefix with oneMKL (pip `mkl`, `mkl-include`): include/mkl_cblas.h, lib/libmkl_rt.so.2."""
    prefix = os.path.join(CACHE, "mkl")
    lib = os.path.join(prefix, "lib")
    if not os.path.exists(os.path.join(prefix, "include", "mkl_cblas.h")):
        pip_install(["--prefix", prefix, "--no-warn-script-location", "mkl", "mkl-include"], log)
    if not os.path.exists(os.path.join(lib, "libmkl_rt.so")):
        rt = sorted(f for f in os.listdir(lib) if f.startswith("libmkl_rt.so."))
        if not rt:
            raise RuntimeError(f"no libmkl_rt.so* in {lib}")
        os.symlink(rt[0], os.path.join(lib, "libmkl_rt.so"))
    # sgemm runs inside our OpenMP loop over images: MKL itself single-threaded (and no libiomp5
    # next to libgomp in one process)
    os.environ["MKL_THREADING_LAYER"] = "SEQUENTIAL"
    return os.path.join(prefix, "include"), lib, "mkl_rt"


def build_harness(name, source, inc, libdir, lib, log, extra=()):
    """Compile ``source`` into CACHE/harness/<hash>/<name>.so (g++ -O3 -fopenmp) and load it."""
    if shutil.which("g++") is None:
        raise RuntimeError("g++ not found")
    flags = ["-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-std=c++17", f"-I{inc}",
             f"-L{libdir}", f"-Wl,--disable-new-dtags,-rpath,{libdir}", f"-l{lib}"] + list(extra)
    h = hashlib.sha256((source + repr(flags)).encode()).hexdigest()[:16]
    out_dir = os.path.join(CACHE, "harness", h)
    so = os.path.join(out_dir, f"{name}.so")
    if not os.path.exists(so):
        os.makedirs(out_dir, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, f"{name}.cpp")
            with open(src, "w") as f:
                f.write(source)
            tmp_so = os.path.join(tmp, f"{name}.so")
            r = subprocess.run(["g++", src, "-o", tmp_so] + flags, capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(f"g++ failed: {r.stderr.strip()[-1500:]}")
            shutil.move(tmp_so, so)
        log(f"built {so}")
    dll = ctypes.CDLL(so)
    dll.conv.restype = ctypes.c_int
    dll.conv.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    dll.conv_impl.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
    dll.harness_threads.argtypes = [ctypes.c_int]
    return dll


# ----------------------------------------------------------------------------- backends
class Problem:
    """Inputs of one shape (numpy, NCHW float32), MegEngine's weight layout (grouped: G, O/G, C/G, k, k)."""

    def __init__(self, shape, rng):
        import numpy as np
        self.shape, self.p = shape, params(shape)
        n, c, h, w, o, k, k2, s, _, pd, _, _, _, g, ho, wo = self.p
        self.groups, self.stride, self.pad = g, s, pd
        self.x = rng.standard_normal((n, c, h, w), dtype=np.float32)
        self.dy = rng.standard_normal((n, o, ho, wo), dtype=np.float32)
        wshape = (o, c, k, k) if g == 1 else (g, o // g, c // g, k, k)
        self.w = (rng.standard_normal(wshape, dtype=np.float32) / (c // g * k * k) ** 0.5).astype(np.float32)
        self.out_shape = {"fwd": self.dy.shape, "bwd-data": self.x.shape, "bwd-w": self.w.shape}


class HarnessBackend:
    def __init__(self, name, dll):
        self.name, self.dll = name, dll
        self.pbuf = {}

    def set_threads(self, t):
        self.dll.harness_threads(t)

    def supports_threads(self, t):
        # the SYCL build runs on the OpenCL CPU runtime's TBB pool (all cores): no thread control
        return self.name != "dnnl2026" or t == os.cpu_count()

    def prepare(self, prob):
        import numpy as np
        key = id(prob)
        if key not in self.pbuf:
            self.pbuf[key] = {"p": np.array(prob.p, dtype=np.int32),
                              "out": {op: np.empty(prob.out_shape[op], np.float32) for op in OPS}}

    def run(self, prob, op):
        b = self.pbuf[id(prob)]
        a_in, b_in = {"fwd": (prob.x, prob.w), "bwd-data": (prob.dy, prob.w), "bwd-w": (prob.x, prob.dy)}[op]
        out = b["out"][op]
        rc = self.dll.conv(OPS.index(op), b["p"].ctypes.data, a_in.ctypes.data, b_in.ctypes.data, out.ctypes.data)
        if rc:
            raise RuntimeError(f"{self.name} {op} failed")
        return out

    def impl(self, prob, op):
        buf = ctypes.create_string_buffer(256)
        self.dll.conv_impl(OPS.index(op), self.pbuf[id(prob)]["p"].ctypes.data, buf, 256)
        return buf.value.decode()


class MgeBackend:
    """MegEngine's conv ops; ``numpy_wgrad`` = basebn's path (numpy conv_weight_grad for bwd-w)."""

    def __init__(self, name, numpy_wgrad=False):
        import megengine as mge
        self.mge, self.name, self.numpy_wgrad = mge, name, numpy_wgrad
        self.device = "cpu0"
        self.t = {}

    def set_threads(self, t):
        self.device = "cpu0" if t == 1 else f"multithread{t}:0"
        self.t = {}

    def prepare(self, prob):
        import numpy as np
        from megengine.core.ops import builtin
        key = id(prob)
        if key in self.t:
            return
        mge, dev = self.mge, self.device
        n, c, h, w, o, k, _, s, _, pd, _, _, _, g, ho, wo = prob.p
        kw = dict(stride_h=s, stride_w=s, pad_h=pd, pad_w=pd, dilate_h=1, dilate_w=1,
                  sparse="dense" if g == 1 else "group")
        self.t[key] = {
            "x": mge.tensor(prob.x, device=dev), "w": mge.tensor(prob.w, device=dev),
            "dy": mge.tensor(prob.dy, device=dev), "p": prob.p,
            "xshape": mge.tensor(np.array(prob.x.shape, np.int32), device=dev),
            "fwd": builtin.Convolution(**kw), "bwd-data": builtin.ConvolutionBackwardData(**kw),
        }

    def run(self, prob, op):
        from megengine.core._imperative_rt import core2
        d = self.t[id(prob)]
        if op == "bwd-w" and self.numpy_wgrad:
            from basebn.layers.conv import conv_weight_grad
            return conv_weight_grad(prob.x, prob.dy, prob.w.shape, prob.stride, prob.pad, 1, prob.groups)
        if op == "fwd":
            (y,) = core2.apply(d["fwd"], d["x"], d["w"])
        elif op == "bwd-data":
            (y,) = core2.apply(d["bwd-data"], d["w"], d["dy"], d["xshape"])
        else:
            return self._wgrad(d, timed=False)
        return y.numpy()  # waits for the kernel (and copies the result: counted, like the reorders)

    def _wgrad(self, d, timed):
        # MegEngine 1.13 has no ConvolutionBackwardFilter builtin for Python: its weight gradient
        # is what GradManager runs for F.conv2d. The forward is recorded untimed, then
        # backward(y, dy) with only w attached is timed (the filter-gradient kernel + the copy out).
        import megengine.functional as F
        from megengine.autodiff import GradManager
        w = self.mge.Parameter(d["w"])
        gm = GradManager().attach([w])
        _, _, _, _, _, _, _, s, _, pd, _, _, _, g, _, _ = d["p"]
        with gm:
            y = F.conv2d(d["x"], w, None, s, pd, 1, g)
            y.numpy()
            t0 = time.perf_counter()
            gm.backward(y, d["dy"])
            out = w.grad.numpy()
            dt = time.perf_counter() - t0
        return dt if timed else out

    def timed(self, prob, op):
        if op != "bwd-w" or self.numpy_wgrad:
            t0 = time.perf_counter()
            self.run(prob, op)
            return time.perf_counter() - t0
        return self._wgrad(self.t[id(prob)], timed=True)

    def impl(self, prob, op):
        return "numpy conv_weight_grad" if (op == "bwd-w" and self.numpy_wgrad) else f"megengine ({self.device})"


TORCH_WORKER = r"""
import json, sys, time
import numpy as np
import torch
import torch.nn.functional as F
torch.set_grad_enabled(False)
probs = {}
for line in sys.stdin:
    m = json.loads(line)
    if m["cmd"] == "threads":
        torch.set_num_threads(m["t"]); probs.clear(); out = {"ok": torch.get_num_threads()}
    elif m["cmd"] == "prep":
        d = np.load(m["file"])
        probs[m["key"]] = dict(x=torch.from_numpy(d["x"]), w=torch.from_numpy(d["w"]), dy=torch.from_numpy(d["dy"]),
                                s=m["s"], p=m["p"], g=m["g"])
        out = {"ok": torch.__version__}
    else:
        q = probs[m["key"]]; op = m["op"]
        x, w, dy, s, p, g = q["x"], q["w"], q["dy"], q["s"], q["p"], q["g"]
        w4 = w.reshape(-1, *w.shape[-3:])
        t0 = time.perf_counter()
        # the aten ops autograd calls for F.conv2d's forward and backward
        if op == "fwd":
            r = torch.ops.aten.convolution(x, w4, None, [s, s], [p, p], [1, 1], False, [0, 0], g)
        else:
            mask = [True, False, False] if op == "bwd-data" else [False, True, False]
            dx, dw, _ = torch.ops.aten.convolution_backward(dy, x, w4, None, [s, s], [p, p], [1, 1], False,
                                                           [0, 0], g, mask)
            r = dx if op == "bwd-data" else dw
        dt = time.perf_counter() - t0
        out = {"t": dt}
        if m.get("save"):
            np.save(m["save"], r.reshape(m["shape"]).numpy()); out["saved"] = m["save"]
    sys.stdout.write(json.dumps(out) + "\n"); sys.stdout.flush()
"""


class BasebnOpBackend:
    """basebn's conv custom ops (what training runs on CPU), timed up to the result in numpy."""

    def __init__(self):
        import megengine as mge
        from basebn.ops import conv_ops, kernel_library
        if not kernel_library.conv_kernel_available():
            raise RuntimeError(f"basebn conv ops unavailable: {kernel_library.conv_kernel_error()}")
        self.mge, self.ops, self.name, self.t = mge, conv_ops, "basebn-op", {}

    def set_threads(self, t):
        os.environ["BASEBN_NUM_THREADS"] = str(t)  # read by the ops on every call
        self.t = {}

    def prepare(self, prob):
        if id(prob) in self.t:
            return
        mge = self.mge
        geom = self.ops.ConvGeometry((prob.stride,) * 2, (prob.pad,) * 2, (1, 1), prob.groups)
        self.t[id(prob)] = {"x": mge.tensor(prob.x), "w": mge.tensor(prob.w), "dy": mge.tensor(prob.dy), "geom": geom}

    def run(self, prob, op):
        d = self.t[id(prob)]
        if op == "fwd":
            out = self.ops.conv_forward(d["x"], d["w"], None, d["geom"])
        elif op == "bwd-data":
            out = self.ops.conv_backward_data(d["dy"], d["w"], prob.x.shape[2:], d["geom"])
        else:
            out = self.ops.conv_backward_weights(d["x"], d["dy"], prob.w.shape[-2:], d["geom"])[0]
        return out.numpy()  # waits for the op and copies the result (as `mge` does)

    def impl(self, prob, op):
        return "basebn conv custom op (oneDNN)"


class TorchBackend:
    """PyTorch in another interpreter; each call is timed inside the worker (no pipe latency)."""

    def __init__(self, python, tmp):
        self.name, self.tmp = "torch", tmp
        worker = os.path.join(tmp, "torch_worker.py")
        with open(worker, "w") as f:
            f.write(TORCH_WORKER)
        env = dict(os.environ, OMP_NUM_THREADS="2")
        self.proc = subprocess.Popen([python, worker], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env)
        self.version = None
        self.keys = set()

    def _call(self, **m):
        self.proc.stdin.write(json.dumps(m) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("torch worker died")
        return json.loads(line)

    def set_threads(self, t):
        self._call(cmd="threads", t=t)
        self.keys = set()

    def prepare(self, prob):
        import numpy as np
        key = str(id(prob))
        if key in self.keys:
            return
        f = os.path.join(self.tmp, f"p{key}.npz")
        if not os.path.exists(f):
            np.savez(f, x=prob.x, w=prob.w, dy=prob.dy)
        self.version = self._call(cmd="prep", key=key, file=f, s=prob.stride, p=prob.pad, g=prob.groups)["ok"]
        self.keys.add(key)

    def timed(self, prob, op):
        return self._call(cmd="run", key=str(id(prob)), op=op)["t"]

    def run(self, prob, op):
        import numpy as np
        f = os.path.join(self.tmp, "out.npy")
        self._call(cmd="run", key=str(id(prob)), op=op, save=f, shape=list(prob.out_shape[op]))
        return np.load(f)

    def impl(self, prob, op):
        return f"torch {self.version}"

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def timed(backend, prob, op):
    if hasattr(backend, "timed"):
        return backend.timed(prob, op)
    t0 = time.perf_counter()
    backend.run(prob, op)
    return time.perf_counter() - t0


def rel_err(a, b):
    import numpy as np
    a, b = np.asarray(a, np.float64).reshape(-1), np.asarray(b, np.float64).reshape(-1)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


# ----------------------------------------------------------------------------- main
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="ResNet-20 shapes + 3 others, 3 rounds")
    ap.add_argument("--threads", type=int, nargs="+", default=[2, 1])
    ap.add_argument("--rounds", type=int, default=None, help="timed rounds (default 5, --quick 3)")
    ap.add_argument("--shapes", nargs="*", default=None, help="substrings of shape names to keep")
    ap.add_argument("--backends", nargs="*",
                    default=["dnnl", "dnnl-nchw", "blas", "mkl", "mge", "basebn", "basebn-op", "torch"],
                    help="of: dnnl dnnl-nchw dnnl2026 blas mkl mge basebn basebn-op torch")
    ap.add_argument("--torch-python", default=None, help="python with torch (default: CACHE/torch-venv)")
    ap.add_argument("--install-torch", action="store_true", help="create CACHE/torch-venv, pip install torch")
    ap.add_argument("--slow-cap", type=float, default=3.0,
                    help="seconds: a (backend, op) whose warm-up call takes longer gets 1 timed round")
    ap.add_argument("--gap", type=float, default=0.03,
                    help="seconds slept before each timed call (OpenMP/TBB/MegEngine workers spin after work)")
    ap.add_argument("--json", default=None, help="write all timings here")
    add_results_argument(ap)
    args = ap.parse_args()
    rounds = args.rounds or (3 if args.quick else 5)
    shapes = [s for s in SHAPES if (not args.quick or s[0] in QUICK)]
    if args.shapes:
        shapes = [s for s in shapes if any(k in s[0] for k in args.shapes)]

    import numpy as np

    def log(msg):
        print(f"# {msg}", flush=True)

    log(f"cache {CACHE}; {os.cpu_count()} CPUs; {time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
    tmp = tempfile.mkdtemp(prefix="convbench-")
    backends, skipped = [], {}
    if "dnnl" in args.backends:
        try:
            inc, libdir, lib = ensure_onednn(log)
            backends.append(HarnessBackend("dnnl", build_harness("dnnl_conv", DNNL_CPP, inc, libdir, lib, log)))
        except Exception as e:  # noqa: BLE001
            skipped["dnnl"] = str(e)
    if "dnnl-nchw" in args.backends:
        try:
            inc, libdir, lib = ensure_onednn(log)
            backends.append(HarnessBackend("dnnl-nchw", build_harness("dnnl_plain_conv", DNNL_CPP, inc, libdir, lib,
                                                                      log, extra=("-DPLAIN_LAYOUT",))))
        except Exception as e:  # noqa: BLE001
            skipped["dnnl-nchw"] = str(e)
    if "dnnl2026" in args.backends:
        try:
            inc, libdir, lib = ensure_onednn_sycl(log)
            backends.append(HarnessBackend("dnnl2026", build_harness("dnnl_sycl_conv", DNNL_CPP, inc, libdir, lib,
                                                                     log)))
        except Exception as e:  # noqa: BLE001
            skipped["dnnl2026"] = str(e)
    if "mkl" in args.backends:
        try:
            inc, libdir, lib = ensure_mkl(log)
            backends.append(HarnessBackend("mkl", build_harness("mkl_conv", BLAS_CPP, inc, libdir, lib, log,
                                                                extra=("-DUSE_MKL",))))
        except Exception as e:  # noqa: BLE001
            skipped["mkl"] = str(e)
    if "blas" in args.backends:
        try:
            inc, libdir, lib = ensure_openblas(log)
            backends.append(HarnessBackend("blas", build_harness("blas_conv", BLAS_CPP, inc, libdir, lib, log)))
        except Exception as e:  # noqa: BLE001
            skipped["blas"] = str(e)
    for name in ("mge", "basebn"):
        if name in args.backends:
            try:
                backends.append(MgeBackend(name, numpy_wgrad=name == "basebn"))
            except Exception as e:  # noqa: BLE001
                skipped[name] = str(e)
    if "basebn-op" in args.backends:
        try:
            backends.append(BasebnOpBackend())
        except Exception as e:  # noqa: BLE001
            skipped["basebn-op"] = str(e)
    if "torch" in args.backends:
        py = args.torch_python or os.path.join(CACHE, "torch-venv", "bin", "python")
        try:
            if not os.path.exists(py) and args.install_torch and not args.torch_python:
                venv = os.path.dirname(os.path.dirname(py))
                subprocess.run([sys.executable, "-m", "venv", venv], check=True)
                subprocess.run([py, "-m", "pip", "install", "-q", "torch", "numpy"], check=True)
            if not os.path.exists(py):
                raise RuntimeError(f"no {py}: PyPI's torch wheel pulls ~5 GB of CUDA libraries, so it is "
                                   "installed only with --install-torch (or pass --torch-python)")
            tb = TorchBackend(py, tmp)
            tb.set_threads(1)
            backends.append(tb)
        except Exception as e:  # noqa: BLE001
            skipped["torch"] = str(e)
    for k, v in skipped.items():
        log(f"SKIP {k}: {v}")
    names = [b.name for b in backends]
    ref_name = "torch" if "torch" in names else "mge"
    rng = np.random.default_rng(0)
    probs = [Problem(s, rng) for s in shapes]
    results = {}  # (threads, shape, op, backend) -> [times]
    impls, errs = {}, {}
    for t in args.threads:
        for b in backends:
            b.set_threads(t)
        log(f"threads={t}")
        for prob in probs:
            for b in backends:
                b.prepare(prob)
            for op in OPS:
                ref = None
                active, warm = [], {}
                order = sorted(backends, key=lambda b: b.name != "mge")  # MegEngine first: the reference
                for b in order:  # warm-up call + correctness
                    if hasattr(b, "supports_threads") and not b.supports_threads(t):
                        continue
                    if b.name == "basebn" and op != "bwd-w" and "mge" in names:
                        continue  # the same MegEngine op as `mge`: its time is used in the table
                    try:
                        t0 = time.perf_counter()
                        out = b.run(prob, op)
                        warm[b.name] = time.perf_counter() - t0
                        if b.name == "mge":
                            ref = np.array(out)
                        elif ref is not None:
                            errs[(prob.shape[0], op, b.name)] = rel_err(out, ref)
                        if t == args.threads[0]:
                            impls[(prob.shape[0], op, b.name)] = b.impl(prob, op)
                        active.append(b)
                    except Exception as e:  # noqa: BLE001
                        log(f"{b.name} {prob.shape[0]} {op}: {type(e).__name__}: {e}")
                for r in range(rounds):
                    for b in (active if r % 2 == 0 else active[::-1]):
                        if r > 0 and warm[b.name] > args.slow_cap:
                            continue
                        time.sleep(args.gap)  # let the previous backend's spinning worker threads park
                        results.setdefault((t, prob.shape[0], op, b.name), []).append(timed(b, prob, op))
                meds = {b.name: np.median(results[(t, prob.shape[0], op, b.name)]) * 1e3 for b in active}
                log(f"t={t} {prob.shape[0]:22s} {op:8s} " + " ".join(f"{k}={v:.2f}" for k, v in meds.items()))
    for b in backends:
        if isinstance(b, TorchBackend):
            b.close()
    shutil.rmtree(tmp, ignore_errors=True)

    # ------------------------------------------------------------------ table
    def med(t, s, op, name):
        if name == "basebn" and op != "bwd-w" and "mge" in names:
            name = "mge"  # basebn runs MegEngine's own fwd and bwd-data
        v = results.get((t, s, op, name))
        return float(np.median(v)) * 1e3 if v else None

    lines, per_shape, steps = [], [], []
    labels = {"blas": "blas (OpenBLAS)", "basebn": "basebn (old path)"}  # as results/conv_backends.json names them
    hdr = "| threads | shape | op | " + " | ".join(f"{n} ms" for n in names) + " | " + \
        " | ".join(f"{n}/{ref_name}" for n in names if n != ref_name) + " |"
    lines.append(hdr)
    lines.append("|" + "---|" * (3 + len(names) + len(names) - 1))
    for t in args.threads:
        for s in shapes:
            for op in OPS:
                ms = [med(t, s[0], op, n) for n in names]
                ref = med(t, s[0], op, ref_name)
                rat = [(f"{m / ref:.2f}" if (m is not None and ref) else "-")
                       for n, m in zip(names, ms) if n != ref_name]
                lines.append(f"| {t} | {s[0]} | {op} | " + " | ".join("-" if m is None else f"{m:.2f}" for m in ms)
                             + " | " + " | ".join(rat) + " |")
                per_shape.append(dict({"threads": t, "shape": s[0], "op": op},
                                      **{f"{n} ms": round(m, 2) for n, m in zip(names, ms) if m is not None}))
        # whole ResNet-20 step
        tot = {}
        for n in names:
            acc, ok = 0.0, True
            for s in shapes:
                if not s[10]:
                    continue
                for op in OPS:
                    if op == "bwd-data" and s[0].startswith("r20 stem"):
                        continue
                    m = med(t, s[0], op, n)
                    if m is None:
                        ok = False
                    else:
                        acc += m * s[10]
            tot[n] = acc if ok else None
        ref = tot.get(ref_name)
        n_r20 = sum(1 for s in shapes if s[10])
        label = ("ResNet-20 step, all convs" if n_r20 == sum(1 for s in SHAPES if s[10])
                 else f"ResNet-20 step, PARTIAL ({n_r20} shapes)")
        steps.append(dict({"threads": t, "stat": "median"},
                          **{labels.get(n, n): round(tot[n]) for n in names if tot[n] is not None}))
        lines.append(f"| {t} | **{label}** | fwd+bwd | "
                     + " | ".join("-" if tot[n] is None else f"**{tot[n]:.1f}**" for n in names) + " | "
                     + " | ".join((f"{tot[n] / ref:.2f}" if tot[n] and ref else "-") for n in names if n != ref_name)
                     + " |")
    print()
    print("\n".join(lines))
    print()
    print("max relative error vs MegEngine (max|a-b|/max|ref|), worst over ops, per backend and shape:")
    for s in shapes:
        es = {n: [errs[(s[0], op, n)] for op in OPS if (s[0], op, n) in errs] for n in names if n != "mge"}
        print(f"  {s[0]:22s} " + " ".join(f"{n}={max(e):.1e}" if e else f"{n}=-" for n, e in es.items()))
    print()
    print("implementations chosen (first thread count):")
    for s in shapes:
        for op in OPS:
            for n in ("dnnl", "dnnl-nchw"):
                if (s[0], op, n) in impls:
                    print(f"  {s[0]:22s} {op:8s} {n}: {impls[(s[0], op, n)]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": {"|".join(map(str, k)): v for k, v in results.items()},
                       "errs": {"|".join(k): v for k, v in errs.items()},
                       "impls": {"|".join(k): v for k, v in impls.items()}, "skipped": skipped,
                       "table": lines}, f, indent=1)
    step_key = "resnet20_step_convs_ms" if n_r20 == sum(1 for s in SHAPES if s[10]) else \
        "resnet20_step_convs_ms_partial"
    figures = {step_key: sorted(steps, key=lambda row: row["threads"]), "per_shape_ms": per_shape,
               "reference": ref_name, "rounds": rounds}
    if skipped:
        figures["skipped"] = sorted(skipped)
    save_run(args.results, "benchmarks/bench_conv_backends.py", "backends", args.threads, figures,
             "CPU convolution backends: every conv of a ResNet-20 step (and ResNet-18 / MobileNetV2 shapes), forward, "
             "data and weight gradients, with the NCHW <-> blocked reorders",
             conditions=f"backends interleaved round by round, {args.gap * 1e3:g} ms gap before each call, median of "
                        f"{rounds} rounds after one warm-up call",
             torch_python=(args.torch_python or os.path.join(CACHE, "torch-venv", "bin", "python"))
             if "torch" in names else None)


if __name__ == "__main__":
    main()
