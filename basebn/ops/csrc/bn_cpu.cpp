// CPU BatchNorm kernels: multi-threaded (OpenMP pool, static split), contiguous vectorisable inner loops.
//
// Work decomposition on the contiguous (N, C, S) view:
//  * S >= kRowMinS ("rows" path): the N*C rows of S contiguous elements are split over threads;
//    each row is reduced in chunks of kChunk elements (float partial sums, L1-resident second
//    pass), chunk results are merged in double with Chan's formula, rows of one channel are then
//    merged exactly in double.
//  * S <  kRowMinS ("columns" path, e.g. 2D (N, C) input): the (N, C*S) matrix is split into
//    blocks of rows; per block, column sums are vectorised across columns; block moments are
//    merged into per-thread double accumulators (Chan), then threads, then the S columns of each
//    channel are merged.
// Statistics use a compensated two-pass per block: mean_b from a first pass, then
// sum(x - mean_b) and sum((x - mean_b)^2), so no E[x^2] - E[x]^2 cancellation.
// Non-contiguous inputs (or force_strided, used by tests) are gathered into a contiguous buffer.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "bn_cpu_rows.h"
#include "bn_kernels.h"
#include "bn_math.h"
#include "queued_work.h"
#include "strided_copy.h"
#include "thread_env.h"

namespace basebn {
namespace cpu {

using custom::DTypeEnum;
using custom::Tensor;

namespace {

using rows::kChunk;
using rows::merge_channel_rows;
using rows::row_moments;
using rows::bn_v4f;
using rows::hsum4;
using rows::ld4;
constexpr int64_t kRowMinS = 32;           // below: columns path
constexpr int64_t kMinElemsPerThread = 1 << 15;  // below this a second thread costs more than it saves

// $BASEBN_NUM_THREADS (thread_env.h), else OpenMP's default (OMP_NUM_THREADS, else the cores), as the fused kernels
int max_threads() {
    const int v = env_threads();
    if (v > 0)
        return v;
#ifdef _OPENMP
    static const int detected = omp_get_max_threads();
    return detected;
#else
    return 1;
#endif
}

// Number of threads for `items` independent work items covering `elems` elements.
int plan_threads(int64_t items, int64_t elems) {
    int64_t nt = std::min<int64_t>(max_threads(), items);
    nt = std::min<int64_t>(nt, std::max<int64_t>(1, elems / kMinElemsPerThread));
    return static_cast<int>(std::max<int64_t>(1, nt));
}

// f(begin, end, part) over [0, n) split evenly into nt parts, run on OpenMP's pool (it stays up between
// calls: a short op costs microseconds, not a thread start). The split depends on nt alone, so results do
// not depend on how many threads OpenMP grants; a thread given fewer than requested runs several parts.
template <class F>
void run_parallel(int nt, int64_t n, F&& f) {
    if (nt <= 1 || n <= 1) {
        f(int64_t(0), n, 0);
        return;
    }
#ifdef _OPENMP
#pragma omp parallel num_threads(nt)
    {
        const int got = omp_get_num_threads();
        for (int part = omp_get_thread_num(); part < nt; part += got)
            f(n * part / nt, n * (part + 1) / nt, part);
    }
#else
    for (int part = 0; part < nt; ++part)
        f(n * part / nt, n * (part + 1) / nt, part);
#endif
}

// Pointer to a contiguous copy of t's elements (t's own memory when it is contiguous).
template <typename T>
const T* contiguous(const Tensor& t, std::vector<T>& buf, bool force) {
    if (t.is_contiguous() && !force)
        return t.data<T>();
    return gather_strided(t, buf);
}

// Per-channel float32 vector (copied, so strides never matter); nullptr -> fill.
std::vector<float> channel_vec(const Tensor* t, int64_t C, float fill, bool force) {
    std::vector<float> v(C, fill);
    if (t == nullptr)
        return v;
    custom_assert(
            static_cast<int64_t>(t->size()) == C, "per-channel tensor has %zu elements, "
            "expected %lld", t->size(), static_cast<long long>(C));
    std::vector<float> buf;
    const float* p = contiguous<float>(*t, buf, force);
    std::copy(p, p + C, v.begin());
    return v;
}

template <typename T>
T* out_ptr(Tensor& t) {
    custom_assert(t.is_contiguous() || t.size() == 0, "output tensor is not contiguous");
    return t.data<T>();
}

// ------------------------------------------------------------------ stats
// s1 = sum(g), s2 = sum(g * (q - c))
template <typename T>
inline void span_grad_sums(const T* g, const T* q, int64_t len, float c, float& s1, float& s2) {
    s1 = 0.f;
    s2 = 0.f;
    for (int64_t i = 0; i < len; ++i) {
        const float gv = BnIO<T>::load(g[i]);
        s1 += gv;
        s2 += gv * (BnIO<T>::load(q[i]) - c);
    }
}

template <>
inline void span_grad_sums<float>(
        const float* g, const float* q, int64_t len, float c, float& s1, float& s2) {
    const bn_v4f cv = {c, c, c, c};
    bn_v4f a0 = {0.f, 0.f, 0.f, 0.f}, a1 = a0, b0 = a0, b1 = a0;
    int64_t i = 0;
    for (; i + 8 <= len; i += 8) {
        const bn_v4f g0 = ld4(g + i), g1 = ld4(g + i + 4);
        a0 += g0;
        a1 += g1;
        b0 += g0 * (ld4(q + i) - cv);
        b1 += g1 * (ld4(q + i + 4) - cv);
    }
    s1 = hsum4(a0 + a1);
    s2 = hsum4(b0 + b1);
    for (; i < len; ++i) {
        s1 += g[i];
        s2 += g[i] * (q[i] - c);
    }
}

template <typename T>
void stats_rows(const T* x, const Dims& d, float* mean, float* m2) {
    const int64_t R = d.N * d.C;
    std::vector<double> rm(R), rm2(R);
    run_parallel(plan_threads(R, R * d.S), R, [&](int64_t b, int64_t e, int) {
        for (int64_t r = b; r < e; ++r)
            row_moments(x + r * d.S, d.S, rm[r], rm2[r]);
    });
    for (int64_t c = 0; c < d.C; ++c)
        merge_channel_rows(rm.data() + c, rm2.data() + c, d.N, d.C, d.S, mean[c], m2[c]);
}

// Rows per block of the columns path: a block of up to kColumnBlockElems values (512 KB of float) is swept twice,
// the second time from L2, and each block costs one Chan merge per column. With 16 K values a 32x960x4x4 input
// (W = 15 360) would get one-row blocks and 491 520 merges, its statistics ~4.6x slower at 1 thread
// (results/bn_stats_columns.json).
constexpr int64_t kColumnBlockElems = 131072;

int64_t block_rows(int64_t W) {
    return std::max<int64_t>(1, std::min<int64_t>(256, kColumnBlockElems / std::max<int64_t>(W, 1)));
}

template <typename T>
void stats_cols(const T* x, const Dims& d, float* mean, float* m2) {
    const int64_t W = d.C * d.S;
    const int64_t B = block_rows(W);
    const int64_t nblk = (d.N + B - 1) / B;
    const int nt = plan_threads(nblk, d.N * W);
    std::vector<double> tn(nt, 0.0), tmean(nt * W, 0.0), tm2(nt * W, 0.0);
    run_parallel(nt, nblk, [&](int64_t b0, int64_t b1, int t) {
        std::vector<float> mb(W), sd(W), sd2(W);
        double* M = &tmean[t * W];
        double* M2 = &tm2[t * W];
        for (int64_t blk = b0; blk < b1; ++blk) {
            const int64_t r0 = blk * B, r1 = std::min(d.N, r0 + B), len = r1 - r0;
            std::fill(mb.begin(), mb.end(), 0.f);
            for (int64_t r = r0; r < r1; ++r) {
                const T* row = x + r * W;
#pragma omp simd
                for (int64_t j = 0; j < W; ++j)
                    mb[j] += BnIO<T>::load(row[j]);
            }
            const float inv = 1.f / static_cast<float>(len);
            for (int64_t j = 0; j < W; ++j)
                mb[j] *= inv;
            std::fill(sd.begin(), sd.end(), 0.f);
            std::fill(sd2.begin(), sd2.end(), 0.f);
            for (int64_t r = r0; r < r1; ++r) {
                const T* row = x + r * W;
#pragma omp simd
                for (int64_t j = 0; j < W; ++j) {
                    const float dv = BnIO<T>::load(row[j]) - mb[j];
                    sd[j] += dv;
                    sd2[j] += dv * dv;
                }
            }
            for (int64_t j = 0; j < W; ++j) {
                double bm, bm2, nj = tn[t];
                bn_block_moments(static_cast<double>(len), mb[j], sd[j], sd2[j], bm, bm2);
                bn_chan_merge<double>(nj, M[j], M2[j], static_cast<double>(len), bm, bm2);
            }
            tn[t] += static_cast<double>(len);
        }
    });
    double n0 = tn[0];
    for (int t = 1; t < nt; ++t) {
        for (int64_t j = 0; j < W; ++j) {
            double nj = n0;
            bn_chan_merge<double>(nj, tmean[j], tm2[j], tn[t], tmean[t * W + j], tm2[t * W + j]);
        }
        n0 += tn[t];
    }
    for (int64_t c = 0; c < d.C; ++c) {
        double n = 0.0, mu = 0.0, q = 0.0;
        for (int64_t s = 0; s < d.S; ++s)
            bn_chan_merge<double>(
                    n, mu, q, static_cast<double>(d.N), tmean[c * d.S + s], tm2[c * d.S + s]);
        mean[c] = static_cast<float>(mu);
        m2[c] = static_cast<float>(q);
    }
}

// ------------------------------------------------------------------ normalize
template <typename T>
void normalize_impl(
        const T* x, const Dims& d, const float* mean, const float* scale, const float* bias,
        T* y) {
    if (d.S >= kRowMinS) {
        const int64_t R = d.N * d.C;
        run_parallel(plan_threads(R, R * d.S), R, [&](int64_t b, int64_t e, int) {
            for (int64_t r = b; r < e; ++r) {
                const int64_t c = r % d.C;
                const float m = mean[c], s = scale[c], bb = bias[c];
                const T* xi = x + r * d.S;
                T* yo = y + r * d.S;
#pragma omp simd
                for (int64_t i = 0; i < d.S; ++i)
                    yo[i] = BnIO<T>::store(bn_normalize_elem(BnIO<T>::load(xi[i]), m, s, bb));
            }
        });
        return;
    }
    const int64_t W = d.C * d.S;
    std::vector<float> mc(W), sc(W), bc(W);
    for (int64_t j = 0; j < W; ++j) {
        mc[j] = mean[j / d.S];
        sc[j] = scale[j / d.S];
        bc[j] = bias[j / d.S];
    }
    run_parallel(plan_threads(d.N, d.N * W), d.N, [&](int64_t b, int64_t e, int) {
        for (int64_t r = b; r < e; ++r) {
            const T* xi = x + r * W;
            T* yo = y + r * W;
#pragma omp simd
            for (int64_t j = 0; j < W; ++j)
                yo[j] = BnIO<T>::store(bn_normalize_elem(BnIO<T>::load(xi[j]), mc[j], sc[j], bc[j]));
        }
    });
}

// ------------------------------------------------------------------ backward reduce
template <typename T>
void reduce_impl(
        const T* dy, const T* x, const Dims& d, const float* mean, double* sdy, double* sdyx) {
    if (d.S >= kRowMinS) {
        const int64_t R = d.N * d.C;
        std::vector<double> r1(R), r2(R);
        run_parallel(plan_threads(R, R * d.S), R, [&](int64_t b, int64_t e, int) {
            for (int64_t r = b; r < e; ++r) {
                const float m = mean[r % d.C];
                const T* g = dy + r * d.S;
                const T* xi = x + r * d.S;
                double a1 = 0.0, a2 = 0.0;
                for (int64_t off = 0; off < d.S; off += kChunk) {
                    const int64_t len = std::min(kChunk, d.S - off);
                    float s1, s2;
                    span_grad_sums(g + off, xi + off, len, m, s1, s2);
                    a1 += s1;
                    a2 += s2;
                }
                r1[r] = a1;
                r2[r] = a2;
            }
        });
        for (int64_t c = 0; c < d.C; ++c) {
            double a1 = 0.0, a2 = 0.0;
            for (int64_t n = 0; n < d.N; ++n) {
                a1 += r1[n * d.C + c];
                a2 += r2[n * d.C + c];
            }
            sdy[c] = a1;
            sdyx[c] = a2;
        }
        return;
    }
    const int64_t W = d.C * d.S;
    const int64_t B = block_rows(W);
    const int64_t nblk = (d.N + B - 1) / B;
    const int nt = plan_threads(nblk, d.N * W);
    std::vector<double> t1(nt * W, 0.0), t2(nt * W, 0.0);
    std::vector<float> mc(W);
    for (int64_t j = 0; j < W; ++j)
        mc[j] = mean[j / d.S];
    run_parallel(nt, nblk, [&](int64_t b0, int64_t b1, int t) {
        std::vector<float> s1(W), s2(W);
        for (int64_t blk = b0; blk < b1; ++blk) {
            const int64_t r0 = blk * B, r1 = std::min(d.N, r0 + B);
            std::fill(s1.begin(), s1.end(), 0.f);
            std::fill(s2.begin(), s2.end(), 0.f);
            for (int64_t r = r0; r < r1; ++r) {
                const T* g = dy + r * W;
                const T* xi = x + r * W;
#pragma omp simd
                for (int64_t j = 0; j < W; ++j) {
                    const float gv = BnIO<T>::load(g[j]);
                    s1[j] += gv;
                    s2[j] += gv * (BnIO<T>::load(xi[j]) - mc[j]);
                }
            }
            double* a1 = &t1[t * W];
            double* a2 = &t2[t * W];
            for (int64_t j = 0; j < W; ++j) {
                a1[j] += s1[j];
                a2[j] += s2[j];
            }
        }
    });
    for (int64_t c = 0; c < d.C; ++c) {
        double a1 = 0.0, a2 = 0.0;
        for (int t = 0; t < nt; ++t)
            for (int64_t s = 0; s < d.S; ++s) {
                a1 += t1[t * W + c * d.S + s];
                a2 += t2[t * W + c * d.S + s];
            }
        sdy[c] = a1;
        sdyx[c] = a2;
    }
}

// ------------------------------------------------------------------ backward elemt
template <typename T>
void elemt_impl(
        const T* dy, const T* x, const Dims& d, const float* mean, const BnElemtCoef* coef,
        T* dx) {
    if (d.S >= kRowMinS) {
        const int64_t R = d.N * d.C;
        run_parallel(plan_threads(R, R * d.S), R, [&](int64_t b, int64_t e, int) {
            for (int64_t r = b; r < e; ++r) {
                const int64_t c = r % d.C;
                const BnElemtCoef k = coef[c];
                const float m = mean[c];
                const T* g = dy + r * d.S;
                const T* xi = x + r * d.S;
                T* o = dx + r * d.S;
#pragma omp simd
                for (int64_t i = 0; i < d.S; ++i)
                    o[i] = BnIO<T>::store(
                            bn_elemt_elem(BnIO<T>::load(g[i]), BnIO<T>::load(xi[i]), m, k));
            }
        });
        return;
    }
    const int64_t W = d.C * d.S;
    std::vector<float> mc(W), ac(W), mdc(W), kc(W);
    for (int64_t j = 0; j < W; ++j) {
        const int64_t c = j / d.S;
        mc[j] = mean[c];
        ac[j] = coef[c].a;
        mdc[j] = coef[c].mdy;
        kc[j] = coef[c].k;
    }
    run_parallel(plan_threads(d.N, d.N * W), d.N, [&](int64_t b, int64_t e, int) {
        for (int64_t r = b; r < e; ++r) {
            const T* g = dy + r * W;
            const T* xi = x + r * W;
            T* o = dx + r * W;
#pragma omp simd
            for (int64_t j = 0; j < W; ++j) {
                const float v = ac[j] * (BnIO<T>::load(g[j]) - mdc[j] -
                                         (BnIO<T>::load(xi[j]) - mc[j]) * kc[j]);
                o[j] = BnIO<T>::store(v);
            }
        }
    });
}

bool is_half(const Tensor& t) {
    return t.dtype().enumv() == DTypeEnum::float16;
}

void check_float(const Tensor& t, const char* what) {
    const auto e = t.dtype().enumv();
    custom_assert(
            e == DTypeEnum::float32 || e == DTypeEnum::float16,
            "%s must be float32 or float16, got %s", what, t.dtype().str().c_str());
}

}  // namespace

// ------------------------------------------------------------------ entry points
void stats(const Tensor& x, Tensor& mean, Tensor& m2, bool force_strided) {
    wait_for_queued_work();
    check_float(x, "x");
    const Dims d = dims_of(x);
    float* pm = out_ptr<float>(mean);
    float* pq = out_ptr<float>(m2);
    if (d.N * d.S == 0 || x.size() == 0) {
        std::fill(pm, pm + d.C, 0.f);
        std::fill(pq, pq + d.C, 0.f);
        return;
    }
    auto go = [&](auto tag) {
        using T = decltype(tag);
        std::vector<T> buf;
        const T* px = contiguous<T>(x, buf, force_strided);
        if (d.S >= kRowMinS)
            stats_rows(px, d, pm, pq);
        else
            stats_cols(px, d, pm, pq);
    };
    if (is_half(x))
        go(uint16_t());
    else
        go(float());
}

void normalize(
        const Tensor& x, const Tensor& mean, const Tensor& invstd, const Tensor* weight,
        const Tensor* bias, Tensor& y, bool force_strided) {
    wait_for_queued_work();
    check_float(x, "x");
    const Dims d = dims_of(x);
    if (x.size() == 0)
        return;
    const auto m = channel_vec(&mean, d.C, 0.f, force_strided);
    const auto is = channel_vec(&invstd, d.C, 1.f, force_strided);
    const auto w = channel_vec(weight, d.C, 1.f, force_strided);
    const auto b = channel_vec(bias, d.C, 0.f, force_strided);
    std::vector<float> sc(d.C);
    for (int64_t c = 0; c < d.C; ++c)
        sc[c] = bn_norm_scale(is[c], w[c]);
    auto go = [&](auto tag) {
        using T = decltype(tag);
        std::vector<T> buf;
        const T* px = contiguous<T>(x, buf, force_strided);
        normalize_impl<T>(px, d, m.data(), sc.data(), b.data(), out_ptr<T>(y));
    };
    if (is_half(x))
        go(uint16_t());
    else
        go(float());
}

void backward_reduce(
        const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& invstd,
        Tensor& sum_dy, Tensor& sum_dy_xhat, bool force_strided) {
    wait_for_queued_work();
    check_float(x, "x");
    custom_assert(dy.dtype().enumv() == x.dtype().enumv(), "dy and x dtypes differ");
    const Dims d = dims_of(x);
    float* p1 = out_ptr<float>(sum_dy);
    float* p2 = out_ptr<float>(sum_dy_xhat);
    if (x.size() == 0) {
        std::fill(p1, p1 + d.C, 0.f);
        std::fill(p2, p2 + d.C, 0.f);
        return;
    }
    const auto m = channel_vec(&mean, d.C, 0.f, force_strided);
    const auto is = channel_vec(&invstd, d.C, 1.f, force_strided);
    std::vector<double> a1(d.C), a2(d.C);
    auto go = [&](auto tag) {
        using T = decltype(tag);
        std::vector<T> bg, bx;
        const T* pg = contiguous<T>(dy, bg, force_strided);
        const T* px = contiguous<T>(x, bx, force_strided);
        reduce_impl<T>(pg, px, d, m.data(), a1.data(), a2.data());
    };
    if (is_half(x))
        go(uint16_t());
    else
        go(float());
    for (int64_t c = 0; c < d.C; ++c) {
        p1[c] = static_cast<float>(a1[c]);
        p2[c] = static_cast<float>(a2[c] * static_cast<double>(is[c]));
    }
}

void backward_elemt(
        const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& invstd,
        const Tensor* weight, const Tensor& sum_dy, const Tensor& sum_dy_xhat, double count,
        Tensor& dx, bool force_strided) {
    wait_for_queued_work();
    check_float(x, "x");
    custom_assert(dy.dtype().enumv() == x.dtype().enumv(), "dy and x dtypes differ");
    const Dims d = dims_of(x);
    if (x.size() == 0)
        return;
    const auto m = channel_vec(&mean, d.C, 0.f, force_strided);
    const auto is = channel_vec(&invstd, d.C, 1.f, force_strided);
    const auto w = channel_vec(weight, d.C, 1.f, force_strided);
    const auto s1 = channel_vec(&sum_dy, d.C, 0.f, force_strided);
    const auto s2 = channel_vec(&sum_dy_xhat, d.C, 0.f, force_strided);
    const double inv_count = count > 0.0 ? 1.0 / count : 0.0;
    std::vector<BnElemtCoef> coef(d.C);
    for (int64_t c = 0; c < d.C; ++c)
        coef[c] = bn_elemt_coef(is[c], w[c], s1[c], s2[c], inv_count);
    auto go = [&](auto tag) {
        using T = decltype(tag);
        std::vector<T> bg, bx;
        const T* pg = contiguous<T>(dy, bg, force_strided);
        const T* px = contiguous<T>(x, bx, force_strided);
        elemt_impl<T>(pg, px, d, m.data(), coef.data(), out_ptr<T>(dx));
    };
    if (is_half(x))
        go(uint16_t());
    else
        go(float());
}

}  // namespace cpu
}  // namespace basebn
