// Depthwise 2-D convolution (one input and one output channel per group) on NCHW float32, forward, data gradient
// and weight gradient, for the conv ops in conv_dnnl.cpp: square K x K kernels (K = 3, 5, 7), stride 1 or 2,
// symmetric padding, no dilation, planes of at least 14 x 14. Reading and writing NCHW itself saves the two layout
// reorders oneDNN's blocked kernel needs around every call. Every plane is first copied into a zero-padded
// per-thread buffer, so no column needs a bounds check; forward and data gradient are then one stride-1 stencil
// (the data gradient with the kernel turned by 180 degrees, over dy spread out by the stride). Forward and data
// gradient take one (image, channel) plane per task, the weight gradient one channel per task summed in a fixed
// order, so every result is the same for any thread count.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

// BASEBN_DEPTHWISE_PORTABLE leaves the AVX2 code out (tests/ops/test_conv_dnnl.py builds the portable loops so)
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(BASEBN_DEPTHWISE_PORTABLE)
#include <immintrin.h>
#define BASEBN_DEPTHWISE_AVX2 1
#endif

namespace basebn {
namespace depthwise {

using dim = int64_t;
constexpr dim kRow = 32;  // stencil columns per step: four AVX2 vectors, four independent sums
constexpr dim kCols = 8;  // weight-gradient columns per block

// One depthwise conv: N images of C channels, H x W in, HO x WO out, K x K taps, stride S, padding P.
struct Geom {
    dim N, C, H, W, K, S, P, HO, WO;
};

// Whether these kernels take a depthwise conv of this geometry (the rest stays on oneDNN): planes of at least
// 14 x 14 input pixels; on smaller ones oneDNN's blocked kernel (8 or 16 channels per vector) is faster.
inline bool supported(dim kh, dim kw, dim sh, dim sw, dim ph, dim pw, dim dh, dim dw, dim h, dim w) {
    return kh == kw && (kh == 3 || kh == 5 || kh == 7) && sh == sw && (sh == 1 || sh == 2) && ph == pw && ph < kh &&
           dh == 1 && dw == 1 && h * w >= 14 * 14;
}

inline dim round_up(dim v, dim m) {
    return (v + m - 1) / m * m;
}

// ------------------------------------------------------------------ the stencil of one row
// out[c] = bias + sum_{i, j < K} w[i * K + j] * in[i * is + c + j], c < steps * kRow.
template <int K>
void stencil_row_portable(const float* __restrict in, dim is, const float* __restrict w, float bias,
                          float* __restrict out, dim steps) {
    for (dim c = 0; c < steps * kRow; ++c)
        out[c] = bias;
    for (int i = 0; i < K; ++i) {
        for (int j = 0; j < K; ++j) {
            const float wv = w[i * K + j];
            const float* r = in + i * is + j;
#pragma omp simd
            for (dim c = 0; c < steps * kRow; ++c)
                out[c] += wv * r[c];
        }
    }
}

#ifdef BASEBN_DEPTHWISE_AVX2
template <int K>
__attribute__((target("avx2,fma"))) void stencil_row_avx2(const float* in, dim is, const float* w, float bias,
                                                            float* out, dim steps) {
    __m256 wv[K * K];
    for (int t = 0; t < K * K; ++t)
        wv[t] = _mm256_set1_ps(w[t]);
    for (dim s = 0; s < steps; ++s) {
        const float* r = in + s * kRow;
        __m256 a0 = _mm256_set1_ps(bias), a1 = a0, a2 = a0, a3 = a0;
        for (int i = 0; i < K; ++i) {
            for (int j = 0; j < K; ++j) {
                const float* x = r + i * is + j;
                const __m256 v = wv[i * K + j];
                a0 = _mm256_fmadd_ps(v, _mm256_loadu_ps(x), a0);
                a1 = _mm256_fmadd_ps(v, _mm256_loadu_ps(x + 8), a1);
                a2 = _mm256_fmadd_ps(v, _mm256_loadu_ps(x + 16), a2);
                a3 = _mm256_fmadd_ps(v, _mm256_loadu_ps(x + 24), a3);
            }
        }
        float* o = out + s * kRow;
        _mm256_storeu_ps(o, a0);
        _mm256_storeu_ps(o + 8, a1);
        _mm256_storeu_ps(o + 16, a2);
        _mm256_storeu_ps(o + 24, a3);
    }
}
#endif

inline bool use_avx2() {
#ifdef BASEBN_DEPTHWISE_AVX2
    static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    return yes;
#else
    return false;
#endif
}

template <int K>
void stencil_row(const float* in, dim is, const float* w, float bias, float* out, dim steps) {
#ifdef BASEBN_DEPTHWISE_AVX2
    if (use_avx2())
        return stencil_row_avx2<K>(in, is, w, bias, out, steps);
#endif
    stencil_row_portable<K>(in, is, w, bias, out, steps);
}

// ------------------------------------------------------------------ weight gradient of one plane
// dw[t] += sum of dy * xp under tap t, db += sum of dy, over one plane: dyb is dy with rows padded to a multiple of
// kCols with zeros (row stride ds), xp the padded x (row stride xs). Per block of kCols columns the K * K + 1 sums
// run over all rows in float lanes, then go to double.
template <int K, int S>
void weight_grad_plane_portable(const float* __restrict xp, dim xs, const float* __restrict dyb, dim ds, dim ho_n,
                                double* dw, double& db) {
    for (dim c0 = 0; c0 < ds; c0 += kCols) {
        float acc[K * K][kCols] = {};
        float bacc[kCols] = {};
        for (dim ho = 0; ho < ho_n; ++ho) {
            const float* d = dyb + ho * ds + c0;
#pragma omp simd
            for (int l = 0; l < kCols; ++l)
                bacc[l] += d[l];
#pragma GCC unroll 7
            for (int i = 0; i < K; ++i) {
                const float* xr = xp + (ho * S + i) * xs + c0 * S;
#pragma GCC unroll 7
                for (int j = 0; j < K; ++j) {
#pragma omp simd
                    for (int l = 0; l < kCols; ++l)
                        acc[i * K + j][l] += d[l] * xr[l * S + j];
                }
            }
        }
        for (int t = 0; t < K * K; ++t) {
            for (int l = 0; l < kCols; ++l)
                dw[t] += acc[t][l];
        }
        for (int l = 0; l < kCols; ++l)
            db += bacc[l];
    }
}

#ifdef BASEBN_DEPTHWISE_AVX2
// x[l * S + j], l < 8, as one vector (stride 2: the even lanes of two loads).
template <int S>
__attribute__((target("avx2,fma"))) inline __m256 load_taps(const float* x) {
    if (S == 1)
        return _mm256_loadu_ps(x);
    const __m256 even = _mm256_shuffle_ps(_mm256_loadu_ps(x), _mm256_loadu_ps(x + 8), _MM_SHUFFLE(2, 0, 2, 0));
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(even), _MM_SHUFFLE(3, 1, 2, 0)));
}

// weight_grad_plane_portable with the K * K + 1 sums of a column block in registers.
template <int K, int S>
__attribute__((target("avx2,fma"))) void weight_grad_plane_avx2(const float* xp, dim xs, const float* dyb, dim ds,
                                                                  dim ho_n, double* dw, double& db) {
    for (dim c0 = 0; c0 < ds; c0 += kCols) {
        __m256 acc[K * K];
        for (int t = 0; t < K * K; ++t)
            acc[t] = _mm256_setzero_ps();
        __m256 bacc = _mm256_setzero_ps();
        for (dim ho = 0; ho < ho_n; ++ho) {
            const __m256 d = _mm256_loadu_ps(dyb + ho * ds + c0);
            bacc = _mm256_add_ps(bacc, d);
            for (int i = 0; i < K; ++i) {
                const float* xr = xp + (ho * S + i) * xs + c0 * S;
                for (int j = 0; j < K; ++j)
                    acc[i * K + j] = _mm256_fmadd_ps(d, load_taps<S>(xr + j), acc[i * K + j]);
            }
        }
        alignas(32) float lanes[kCols];
        for (int t = 0; t <= K * K; ++t) {
            _mm256_store_ps(lanes, t < K * K ? acc[t] : bacc);
            double sum = 0.0;
            for (int l = 0; l < kCols; ++l)
                sum += lanes[l];
            if (t < K * K)
                dw[t] += sum;
            else
                db += sum;
        }
    }
}
#endif

template <int K, int S>
void weight_grad_plane(const float* xp, dim xs, const float* dyb, dim ds, dim ho_n, double* dw, double& db) {
#ifdef BASEBN_DEPTHWISE_AVX2
    if (use_avx2())
        return weight_grad_plane_avx2<K, S>(xp, xs, dyb, ds, ho_n, dw, db);
#endif
    weight_grad_plane_portable<K, S>(xp, xs, dyb, ds, ho_n, dw, db);
}

// ------------------------------------------------------------------ the three ops
// dst (row stride `stride`) gets src (h x w) at row r0 + r * step, column c0 + c * step. Nothing else of dst is
// written: a buffer zeroed once and used for one geometry keeps its padding zero from plane to plane.
inline void spread_plane(const float* src, dim h, dim w, dim r0, dim c0, dim step, float* dst, dim stride) {
    for (dim r = 0; r < h; ++r) {
        float* d = dst + (r0 + r * step) * stride + c0;
        const float* s = src + r * w;
        if (step == 1) {
            std::memcpy(d, s, sizeof(float) * w);
        } else {
            for (dim c = 0; c < w; ++c)
                d[c * step] = s[c];
        }
    }
}

// Asks the cache for the n floats at p, a plane needed next.
inline void prefetch(const float* p, dim n) {
    for (dim i = 0; i < n; i += 16)
        __builtin_prefetch(p + i);
}

// Narrow planes (output rows of at most kRow columns) take the stride-1 stencil over the whole zero-padded plane
// (row stride cols) at once: output p = r * cols + c reads in[p + i * cols + j], so a row's last K - 1 outputs mix
// in the next row and are dropped, rows are not padded out to kRow columns each, and the weights are broadcast
// once per plane, not per row (14 x 14 planes: 2.3x faster; 56 x 56 planes are 10-15% slower this way and keep
// one stencil per row; benchmarks/bench_conv_layout.py). The buffer holds flat_size(out_rows, cols, K) floats:
// the last step reads past the plane into a tail that stays zero.
inline dim flat_steps(dim out_rows, dim cols) {
    return (out_rows * cols + kRow - 1) / kRow;
}
inline dim flat_size(dim out_rows, dim cols, dim k) {
    return flat_steps(out_rows, cols) * kRow + (k - 1) * (cols + 1);
}

template <int K, int S>
void forward_k(const float* x, const float* w, const float* bias, float* y, const Geom& g, int threads) {
    const bool flat = S == 1 && g.WO <= kRow;
    const dim rows = g.H + 2 * g.P, row_steps = (S * (g.WO - 1) + 1 + kRow - 1) / kRow;  // columns 0 .. S(WO - 1)
    const dim cols = flat ? g.W + 2 * g.P : std::max(g.W + 2 * g.P, row_steps * kRow + K - 1);
    const dim steps = flat ? flat_steps(g.HO, cols) : row_steps;
#pragma omp parallel num_threads(threads)
    {
        std::vector<float> xp(flat ? std::max(rows * cols, flat_size(g.HO, cols, K)) : rows * cols);
        std::vector<float> out(steps * kRow);
#pragma omp for schedule(static)
        for (dim nc = 0; nc < g.N * g.C; ++nc) {
            const dim c = nc % g.C;
            const float* wc = w + c * K * K;
            const float b = bias != nullptr ? bias[c] : 0.f;
            spread_plane(x + nc * g.H * g.W, g.H, g.W, g.P, g.P, 1, xp.data(), cols);
            if (flat)
                stencil_row<K>(xp.data(), cols, wc, b, out.data(), steps);
            for (dim ho = 0; ho < g.HO; ++ho) {
                if (!flat)
                    stencil_row<K>(xp.data() + ho * S * cols, cols, wc, b, out.data(), steps);
                const float* src = flat ? out.data() + ho * cols : out.data();
                float* yr = y + (nc * g.HO + ho) * g.WO;
                for (dim wo = 0; wo < g.WO; ++wo)
                    yr[wo] = src[wo * S];
            }
        }
    }
}

// dx[h, w] = sum_{i, j} w[i, j] dy[(h + P - i) / S, (w + P - j) / S] over the exact quotients: the stride-1
// stencil, kernel turned by 180 degrees, over dy spread S apart and padded by K - 1 - P.
template <int K, int S>
void backward_data_k(const float* dy, const float* w, const float* addend, float* dx, const Geom& g, int threads) {
    const bool flat = g.W <= kRow;
    const dim q = K - 1 - g.P, rows = g.H + K - 1, row_steps = (g.W + kRow - 1) / kRow;
    const dim cols = flat ? g.W + K - 1 : row_steps * kRow + K - 1, steps = flat ? flat_steps(g.H, cols) : row_steps;
#pragma omp parallel num_threads(threads)
    {
        std::vector<float> buf(flat ? std::max(rows * cols, flat_size(g.H, cols, K)) : rows * cols);
        std::vector<float> out(steps * kRow);
#pragma omp for schedule(static)
        for (dim nc = 0; nc < g.N * g.C; ++nc) {
            const float* wc = w + (nc % g.C) * K * K;
            float turned[K * K];
            for (int t = 0; t < K * K; ++t)
                turned[t] = wc[K * K - 1 - t];
            spread_plane(dy + nc * g.HO * g.WO, g.HO, g.WO, q, q, S, buf.data(), cols);
            if (flat)
                stencil_row<K>(buf.data(), cols, turned, 0.f, out.data(), steps);
            for (dim h = 0; h < g.H; ++h) {
                if (!flat)
                    stencil_row<K>(buf.data() + h * cols, cols, turned, 0.f, out.data(), steps);
                const float* src = flat ? out.data() + h * cols : out.data();
                float* dst = dx + (nc * g.H + h) * g.W;
                if (addend != nullptr) {
                    const float* a = addend + (nc * g.H + h) * g.W;
#pragma omp simd
                    for (dim c = 0; c < g.W; ++c)
                        dst[c] = src[c] + a[c];
                } else {
                    std::memcpy(dst, src, sizeof(float) * g.W);
                }
            }
        }
    }
}

template <int K, int S>
void backward_weights_k(const float* x, const float* dy, float* dw, float* db, const Geom& g, int threads) {
    const dim wo_cols = round_up(g.WO, kCols), rows = g.H + 2 * g.P;
    const dim cols = std::max(g.W + 2 * g.P, (wo_cols - 1) * S + K + 8);  // (+ 8: the stride-2 loads' second half)
#pragma omp parallel num_threads(threads)
    {
        std::vector<float> xp(rows * cols), dyb(g.HO * wo_cols);
#pragma omp for schedule(static)
        for (dim c = 0; c < g.C; ++c) {
            double acc[K * K] = {}, bacc = 0.0;
            for (dim n = 0; n < g.N; ++n) {
                const dim nc = n * g.C + c;
                if (n + 1 < g.N) {  // the next image's planes lie C planes further on: no prefetcher follows that
                    prefetch(x + (nc + g.C) * g.H * g.W, g.H * g.W);
                    prefetch(dy + (nc + g.C) * g.HO * g.WO, g.HO * g.WO);
                }
                spread_plane(x + nc * g.H * g.W, g.H, g.W, g.P, g.P, 1, xp.data(), cols);
                spread_plane(dy + nc * g.HO * g.WO, g.HO, g.WO, 0, 0, 1, dyb.data(), wo_cols);
                weight_grad_plane<K, S>(xp.data(), cols, dyb.data(), wo_cols, g.HO, acc, bacc);
            }
            for (int t = 0; t < K * K; ++t)
                dw[c * K * K + t] = static_cast<float>(acc[t]);
            if (db != nullptr)
                db[c] = static_cast<float>(bacc);
        }
    }
}

// The kernel size and stride of a supported() geometry as one switch over the instantiated kernels.
#define BASEBN_DEPTHWISE_DISPATCH(g, call) \
    switch ((g).K * 10 + (g).S) {          \
        case 31: call(3, 1); break;        \
        case 32: call(3, 2); break;        \
        case 51: call(5, 1); break;        \
        case 52: call(5, 2); break;        \
        case 71: call(7, 1); break;        \
        default: call(7, 2); break;        \
    }

// y = conv(x, w) + bias (bias: C values or null).
inline void forward(const float* x, const float* w, const float* bias, float* y, const Geom& g, int threads) {
#define BASEBN_CALL(K, S) forward_k<K, S>(x, w, bias, y, g, threads)
    BASEBN_DEPTHWISE_DISPATCH(g, BASEBN_CALL)
#undef BASEBN_CALL
}

// dx = the data gradient of dy (+ addend, dx's shape, when not null).
inline void backward_data(const float* dy, const float* w, const float* addend, float* dx, const Geom& g,
                          int threads) {
#define BASEBN_CALL(K, S) backward_data_k<K, S>(dy, w, addend, dx, g, threads)
    BASEBN_DEPTHWISE_DISPATCH(g, BASEBN_CALL)
#undef BASEBN_CALL
}

// dw (C x K x K) and db (C values, or null) from x and dy.
inline void backward_weights(const float* x, const float* dy, float* dw, float* db, const Geom& g, int threads) {
#define BASEBN_CALL(K, S) backward_weights_k<K, S>(x, dy, dw, db, g, threads)
    BASEBN_DEPTHWISE_DISPATCH(g, BASEBN_CALL)
#undef BASEBN_CALL
}

#undef BASEBN_DEPTHWISE_DISPATCH

}  // namespace depthwise
}  // namespace basebn
