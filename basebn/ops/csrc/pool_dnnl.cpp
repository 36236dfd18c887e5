// 2-D max pooling custom ops for CPU training, NCHW float32 at the boundary (MegEngine's CPU max-pool
// backward runs on one thread: 70.8 ms of a 2-thread ResNet-18 step).
//
//   BasebnMaxPoolFwd (x)          -> (y)    y = max over each window
//   BasebnMaxPoolBwd (dy, x, y)   -> (dx)   dx[i] = sum of dy[o] over the windows o that hold i with x[i] == y[o]
//
// Params: kernel_h/w, stride_h/w, pad_h/w, with 0 <= pad < kernel (no window lies wholly in the padding).
// Padding never wins a window, and y = floor((H + 2 pad - kernel) / stride) + 1, as MegEngine's max pool.
// Ties: MegEngine's convention. MegEngine 1.13's CPU max-pool gradient gives EVERY element equal to its
// window's maximum that window's whole dy (a window of nine zeros after a ReLU sends dy to all nine); oneDNN's
// workspace, like PyTorch, records one argmax (the first) per window. So there is no workspace: the backward
// recomputes the matches from (x, y) (y holds exact copies of x's values, so x == y is exact) and adds each
// element's windows in (oh, ow) order.
// Plain OpenMP loops, not oneDNN's pooling: its plain-layout (nchw) max pool is a reference loop, its jit pool
// needs nChw8c reorders, and its backward follows its workspace; these loops' forward is ~2.5x faster than the
// jit pool with its reorders and ~30x faster than the reference loop on 32x64x56x56 at 1 thread
// (results/max_pool.json). The file builds with the oneDNN ops: same switch, same thread rule (dnnl_runtime.h).
// Threads: $BASEBN_NUM_THREADS, else the OpenMP default; the N*C planes are split statically over them, each
// plane summed by one thread (results do not depend on the thread count). Non-contiguous inputs (a broadcast
// dy, a transposed view) are gathered first. Compiled only with -DBASEBN_WITH_DNNL.
#ifdef BASEBN_WITH_DNNL

#include <omp.h>

#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <limits>
#include <vector>

#include "dnnl_runtime.h"
#include "megbrain/custom/custom.h"
#include "queued_work.h"
#include "strided_copy.h"

namespace basebn {
namespace max_pool {

using custom::Param;
using custom::Shape;
using custom::Tensor;
using dim = int64_t;

// Every size of one max pooling.
struct Geom {
    dim N, C, H, W, KH, KW, SH, SW, PH, PW, HO, WO;
};

// Geometry from x's shape and the params; custom_assert on what MegEngine's max pool refuses.
Geom geometry(const Shape& x, const Param& p) {
    custom_assert(x.ndim() == 4, "max_pool: x must be 4-D (N, C, H, W), got %zu dims", x.ndim());
    Geom g{};
    g.N = x[0], g.C = x[1], g.H = x[2], g.W = x[3];
    g.KH = p["kernel_h"].as<int32_t>(), g.KW = p["kernel_w"].as<int32_t>();
    g.SH = p["stride_h"].as<int32_t>(), g.SW = p["stride_w"].as<int32_t>();
    g.PH = p["pad_h"].as<int32_t>(), g.PW = p["pad_w"].as<int32_t>();
    custom_assert(g.KH > 0 && g.KW > 0 && g.SH > 0 && g.SW > 0, "max_pool: kernel and stride must be positive");
    custom_assert(g.PH >= 0 && g.PW >= 0 && g.PH < g.KH && g.PW < g.KW,
                  "max_pool: padding (%lld, %lld) must be >= 0 and smaller than the kernel (%lld, %lld)",
                  static_cast<long long>(g.PH), static_cast<long long>(g.PW), static_cast<long long>(g.KH),
                  static_cast<long long>(g.KW));
    custom_assert(g.H + 2 * g.PH >= g.KH && g.W + 2 * g.PW >= g.KW,
                  "max_pool: input %lldx%lld (padding %lld, %lld) is smaller than the kernel %lldx%lld",
                  static_cast<long long>(g.H), static_cast<long long>(g.W), static_cast<long long>(g.PH),
                  static_cast<long long>(g.PW), static_cast<long long>(g.KH), static_cast<long long>(g.KW));
    g.HO = (g.H + 2 * g.PH - g.KH) / g.SH + 1;
    g.WO = (g.W + 2 * g.PW - g.KW) / g.SW + 1;
    return g;
}

Shape out_shape(const Geom& g) {
    return Shape({size_t(g.N), size_t(g.C), size_t(g.HO), size_t(g.WO)});
}

// ------------------------------------------------------------------ the kernels
// Both split the N*C planes statically over the threads and walk a plane row by row, vectorised along W.

// y = max over each window; padding never wins, and neither does a NaN (`v > m` is false): m starts at
// -FLT_MAX, as in MegEngine's max pool. KT, ST: the kernel width and stride when known at compile time (the
// common 3/2 and 2/2: the compiler then unrolls and vectorises the horizontal pass), else 0.
template <int KT, int ST>
void forward(const Geom& g, const float* x, float* y, int threads) {
    const dim K = KT ? KT : g.KW, S = ST ? ST : g.SW;
    const dim WP = (g.WO - 1) * S + K;                    // padded columns the windows read
    const dim lo = g.PW, hi = std::min<dim>(WP, g.PW + g.W);  // those holding x
    const dim planes = g.N * g.C;
#pragma omp parallel num_threads(threads) if (threads > 1 && planes > 1)
    {
        std::vector<float> rowmax(WP);  // max over the window's rows, per padded column
        float* t = rowmax.data();
#pragma omp for schedule(static)
        for (dim p = 0; p < planes; ++p) {
            const float* xp = x + p * g.H * g.W;
            float* yp = y + p * g.HO * g.WO;
            for (dim oh = 0; oh < g.HO; ++oh) {
                std::fill(t, t + WP, -FLT_MAX);
                const dim ih0 = oh * g.SH - g.PH;
                for (dim ih = std::max<dim>(ih0, 0); ih < std::min<dim>(ih0 + g.KH, g.H); ++ih) {
                    const float* xr = xp + ih * g.W - g.PW;  // xr[c]: padded column c
#pragma omp simd
                    for (dim c = lo; c < hi; ++c) {
                        const float v = xr[c], m = t[c];
                        t[c] = v > m ? v : m;
                    }
                }
                float* yr = yp + oh * g.WO;
#pragma omp simd
                for (dim ow = 0; ow < g.WO; ++ow) {
                    float m = t[ow * S];
#pragma GCC unroll 8
                    for (dim k = 1; k < K; ++k) {
                        const float v = t[ow * S + k];
                        m = v > m ? v : m;
                    }
                    yr[ow] = m;
                }
            }
        }
    }
}

// The backward adds, row by row of the input, each window's dy to the elements equal to its y. Along W it
// works in padded columns c = iw + PW: column c is tap c%S + j*S of window ow = c/S - j, for the j with
// c%S + j*S < K (J = ceil(K/S) of them at most). Per output row, the J rows E_j[c] = y[ow], D_j[c] = dy[ow]
// (NaN and 0 where no such window exists: they match nothing) turn the windows' scatter into contiguous
// passes over the input rows, dx[c] += (x[c] == E_j[c]) ? D_j[c] : 0 with j descending: ascending ow, and
// the output rows in ascending oh, the order of a plain loop over the windows, so the sums are the same to the
// bit. JT: J when known at compile time, else 0.
template <int JT>
void add_row(const float* __restrict xr, float* __restrict dr, const float* __restrict E, const float* __restrict D,
             dim n, dim L, dim j_count) {
    const dim J = JT ? JT : j_count;
#pragma omp simd
    for (dim c = 0; c < n; ++c) {
        const float xv = xr[c];
        float v = dr[c];
#pragma GCC unroll 8
        for (dim j = J - 1; j >= 0; --j) {
            const float m = E[j * L + c], d = D[j * L + c];
            v += xv == m ? d : 0.f;
        }
        dr[c] = v;
    }
}

void add_row(const float* xr, float* dr, const float* E, const float* D, dim n, dim L, dim j_count) {
    switch (j_count) {
        case 1: return add_row<1>(xr, dr, E, D, n, L, j_count);
        case 2: return add_row<2>(xr, dr, E, D, n, L, j_count);
        case 3: return add_row<3>(xr, dr, E, D, n, L, j_count);
        default: return add_row<0>(xr, dr, E, D, n, L, j_count);
    }
}

// dx: every element equal to its window's maximum gets that window's dy (MegEngine's convention)
void backward(const Geom& g, const float* dy, const float* x, const float* y, float* dx, int threads) {
    const dim K = g.KW, S = g.SW, WO = g.WO;
    const dim J = (K + S - 1) / S, L = (WO + J) * S;  // L >= (WO - 1)*S + K padded columns
    const dim c0 = g.PW, c1 = std::min<dim>(L, g.PW + g.W);  // the padded columns holding x
    // src[j*L + c]: the window of column c's j-th tap as an index into an output row, or WO (a slot that matches
    // nothing) when there is none
    std::vector<int32_t> src(J * L);
    for (dim j = 0; j < J; ++j)
        for (dim c = 0; c < L; ++c) {
            const dim ow = c / S - j;
            src[j * L + c] = static_cast<int32_t>((c % S) + j * S < K && ow >= 0 && ow < WO ? ow : WO);
        }
    const dim planes = g.N * g.C, H = g.H, W = g.W;
#pragma omp parallel num_threads(threads) if (threads > 1 && planes > 1)
    {
        std::vector<float> E(J * L), D(J * L), yrow(WO + 1), dyrow(WO + 1);
        yrow[WO] = std::numeric_limits<float>::quiet_NaN();
        dyrow[WO] = 0.f;
#pragma omp for schedule(static)
        for (dim p = 0; p < planes; ++p) {
            const float* xp = x + p * H * W;
            const float* yp = y + p * g.HO * WO;
            const float* dyp = dy + p * g.HO * WO;
            float* dxp = dx + p * H * W;
            std::fill(dxp, dxp + H * W, 0.f);
            for (dim oh = 0; oh < g.HO; ++oh) {
                std::copy(yp + oh * WO, yp + (oh + 1) * WO, yrow.begin());
                std::copy(dyp + oh * WO, dyp + (oh + 1) * WO, dyrow.begin());
                for (dim i = 0; i < J * L; ++i) {
                    E[i] = yrow[src[i]];
                    D[i] = dyrow[src[i]];
                }
                const dim ih0 = oh * g.SH - g.PH;
                for (dim ih = std::max<dim>(ih0, 0); ih < std::min<dim>(ih0 + g.KH, H); ++ih)
                    add_row(xp + ih * W, dxp + ih * W, E.data() + c0, D.data() + c0, c1 - c0, L, J);
            }
        }
    }
}

void run_forward(const Geom& g, const float* x, float* y) {
    const int threads = dnnl_rt::set_threads();
    if (g.KW == 3 && g.SW == 2)
        forward<3, 2>(g, x, y, threads);
    else if (g.KW == 2 && g.SW == 2)
        forward<2, 2>(g, x, y, threads);
    else
        forward<0, 0>(g, x, y, threads);
}

void run_backward(const Geom& g, const float* dy, const float* x, const float* y, float* dx) {
    backward(g, dy, x, y, dx, dnnl_rt::set_threads());
}

// ------------------------------------------------------------------ computes and inference
// A contiguous float32 view of t: t's memory, or a strided gather into buf (a broadcast dy, e.g. F.ones_like's,
// or a transposed view)
const float* contiguous(const Tensor& t, std::vector<float>& buf) {
    custom_assert(t.dtype().enumv() == custom::DTypeEnum::float32, "max_pool: tensors must be float32, got %s",
                  t.dtype().str().c_str());
    return t.is_contiguous() ? t.data<float>() : gather_strided(t, buf);
}

float* out_ptr(Tensor& t) {
    custom_assert(t.is_contiguous() || t.size() == 0, "max_pool: output tensor is not contiguous");
    return t.data<float>();
}

void check_same(const Shape& a, const Shape& b, const char* what) {
    bool same = a.ndim() == b.ndim();
    for (size_t i = 0; same && i < a.ndim(); ++i)
        same = a[i] == b[i];
    custom_assert(same, "max_pool: %s does not have the output's shape", what);
}

void fwd_compute(const std::vector<Tensor>& in, const Param& p, std::vector<Tensor>& out) {
    wait_for_queued_work();
    const Geom g = geometry(in[0].shape(), p);
    if (out[0].size() == 0)
        return;
    std::vector<float> bx;
    run_forward(g, contiguous(in[0], bx), out_ptr(out[0]));
}

void bwd_compute(const std::vector<Tensor>& in, const Param& p, std::vector<Tensor>& out) {
    wait_for_queued_work();
    const Geom g = geometry(in[1].shape(), p);
    check_same(in[0].shape(), out_shape(g), "dy");
    check_same(in[2].shape(), out_shape(g), "y");
    if (out[0].size() == 0)
        return;
    std::vector<float> bdy, bx, by;
    const float* dy = contiguous(in[0], bdy);
    const float* x = contiguous(in[1], bx);
    const float* y = contiguous(in[2], by);
    run_backward(g, dy, x, y, out_ptr(out[0]));
}

void fwd_shape(const std::vector<Shape>& in, const Param& p, std::vector<Shape>& out) {
    out[0] = out_shape(geometry(in[0], p));
}

void bwd_shape(const std::vector<Shape>& in, const Param& p, std::vector<Shape>& out) {
    const Geom g = geometry(in[1], p);
    check_same(in[0], out_shape(g), "dy");
    check_same(in[2], out_shape(g), "y");
    out[0] = in[1];
}

}  // namespace max_pool
}  // namespace basebn

CUSTOM_OP_REG_BEGIN(BasebnPool)

using namespace basebn::max_pool;

#define BASEBN_POOL_GEOMETRY_PARAMS                                                                      \
    .add_param("kernel_h", 1).add_param("kernel_w", 1).add_param("stride_h", 1).add_param("stride_w", 1) \
            .add_param("pad_h", 0).add_param("pad_w", 0)

CUSTOM_OP_REG(BasebnMaxPoolFwd)
        .set_description("basebn: oneDNN 2-D max pooling forward, y = max over each window of x")
        .add_input("x", {"float32"})
        .add_output("y", {"float32"}) BASEBN_POOL_GEOMETRY_PARAMS
        .set_device_infer(basebn::dnnl_rt::same_device)
        .set_format_infer(basebn::dnnl_rt::same_format)
        .set_shape_infer(fwd_shape)
        .set_dtype_infer(basebn::dnnl_rt::float_dtype)
        .set_compute("x86", fwd_compute);

CUSTOM_OP_REG(BasebnMaxPoolBwd)
        .set_description("basebn: 2-D max pooling gradient dx from (dy, x, y); every tied maximum gets dy")
        .add_input("dy", {"float32"})
        .add_input("x", {"float32"})
        .add_input("y", {"float32"})
        .add_output("dx", {"float32"}) BASEBN_POOL_GEOMETRY_PARAMS
        .set_device_infer(basebn::dnnl_rt::same_device)
        .set_format_infer(basebn::dnnl_rt::same_format)
        .set_shape_infer(bwd_shape)
        .set_dtype_infer(basebn::dnnl_rt::float_dtype)
        .set_compute("x86", bwd_compute);

#undef BASEBN_POOL_GEOMETRY_PARAMS

CUSTOM_OP_REG_END(BasebnPool)

#endif  // BASEBN_WITH_DNNL
