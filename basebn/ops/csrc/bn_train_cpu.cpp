// One-call local training passes of BatchNorm -> activation [+ shortcut] on the CPU (declared in
// bn_act_kernels.h): the forward computes the batch statistics, invstd and y in one op; the backward the two
// sums and dx [and dshortcut] in one op. Local BN only: SyncBN needs its collectives between the passes.
//
// Two plans, the same bits. Channel-major, when what a pass reads does not stay in the last-level cache between
// its two sweeps (over half of it): channels split statically over OpenMP threads, each thread finishing a channel
// before the next, so the second sweep over a channel's N rows (normalize after the statistics; elemt after the
// sums) reads them from this core's cache (a channel of 32 x 56 x 56 float32 is 400 KB, within a 1 MB L2 per
// core) instead of memory. Otherwise, and where the channels cannot be shared out (C < 4 threads and not a
// multiple of them) or rows are short (S < 2048), the unfused entry points in turn: their row order
// streams better, and a tensor that stays in the last-level cache gains nothing from channel order (see
// channel_threads). Both: one op instead of two plus the MegEngine ops between them. The arithmetic is the
// unfused kernels', in the same order (rows::row_moments and merge_channel_rows for the statistics,
// act_rows::masked_sums per row summed in n order for the backward), so mean, m2 and the sums are bitwise those
// of the unfused ops on either plan, at any thread count.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "bn_act_cpu_rows.h"
#include "bn_act_kernels.h"
#include "bn_cpu_rows.h"
#include "queued_work.h"

namespace basebn {
namespace cpu {

using custom::Tensor;

namespace {

using namespace act_rows;

// The level-3 cache in bytes: sysfs (what lscpu reads; sysconf's figure can be 8x too large on a VM), else
// 32 MB.
int64_t last_level_cache() {
    static const int64_t bytes = [] {
        int64_t v = 0;
        if (FILE* f = std::fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r")) {
            long long n = 0;
            char unit = 0;
            if (std::fscanf(f, "%lld%c", &n, &unit) >= 1)
                v = n * (unit == 'K' ? 1024 : unit == 'M' ? 1024 * 1024 : 1);
            std::fclose(f);
        }
        return v > 0 ? v : int64_t(32) << 20;
    }();
    return bytes;
}

// threads for the channel-major plan, or 0 when the unfused passes should run instead. `bytes`: what the pass
// reads. Channel-major pays only when that does not stay in the last-level cache between the sweeps and the rows
// are long: faster at S = 3136, slower at S <= 784, where short rows far apart stream worse than the row order
// (results/bn_train_ops.json, benchmarks/bench_bn_train_ops.py).
constexpr int64_t kChannelMajorMinS = 2048;

constexpr int64_t kRowMinS = 32;  // bn_cpu.cpp's: below it the unfused statistics take the columns path

// $BASEBN_BN_TRAIN_PLAN = "channels" / "rows" forces a plan (tests: their tensors are small), else by size
int channel_threads(const Dims& d, int64_t bytes) {
    const char* plan = std::getenv("BASEBN_BN_TRAIN_PLAN");
    const bool forced = plan != nullptr && std::strcmp(plan, "channels") == 0;
    if (plan != nullptr && std::strcmp(plan, "rows") == 0)
        return 0;
    if (d.S < kRowMinS || (!forced && (d.S < kChannelMajorMinS || bytes <= last_level_cache() / 2)))
        return 0;
    int64_t nt = std::min<int64_t>(thread_cap(), d.C);
    nt = std::max<int64_t>(1, std::min<int64_t>(nt, d.N * d.C * d.S / kMinElemsPerThread));
    if (nt > 1 && d.C < 4 * nt && d.C % nt != 0)
        return 0;
    return static_cast<int>(nt);
}

template <class F>
void for_channels(int nt, int64_t C, F&& f) {
    (void)nt;  // (unused without OpenMP)
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (int64_t c = 0; c < C; ++c)
        f(c);
}

// invstd = 1 / sqrt(m2 / count + eps) in float, as the Python side computes it for the unfused ops
float invstd_of(float m2, double count, double eps) {
    return 1.f / std::sqrt(m2 * static_cast<float>(1.0 / count) + static_cast<float>(eps));
}

template <typename T, int Act, bool Add>
void forward_channels(int nt, const T* x, const T* sc, const Dims& d, const float* w, const float* bias, double eps,
                      T* y, float* mean, float* m2, float* invstd) {
    std::vector<double> moments(2 * d.N * d.C);
    double* rm = moments.data();
    double* rm2 = rm + d.N * d.C;
    const double count = static_cast<double>(d.N * d.S);
    for_channels(nt, d.C, [=](int64_t c) {
        double* cm = rm + c * d.N;
        double* cm2 = rm2 + c * d.N;
        for (int64_t n = 0; n < d.N; ++n)
            rows::row_moments(x + (n * d.C + c) * d.S, d.S, cm[n], cm2[n]);
        float mu, q;
        rows::merge_channel_rows(cm, cm2, d.N, 1, d.S, mu, q);
        const float is = invstd_of(q, count, eps);
        const float s = bn_norm_scale(is, w[c]), b = bias[c];
        for (int64_t n = 0; n < d.N; ++n)
            normalize_row<T, Act, Add>(x, sc, y, (n * d.C + c) * d.S, d.S, mu, s, b);
        mean[c] = mu;
        m2[c] = q;
        invstd[c] = is;
    });
}

template <typename T, int Act, bool Shortcut>
void backward_channels(int nt, const T* dy, const T* y, const T* x, const Dims& d, const float* mean,
                       const float* invstd, const float* w, const float* bias, T* dx, T* ds, float* sum_dz,
                       float* sum_dz_xhat) {
    const double inv_count = 1.0 / static_cast<double>(d.N * d.S);
    for_channels(nt, d.C, [=](int64_t c) {
        const float m = mean[c], is = invstd[c];
        const float s = bn_norm_scale(is, w[c]), b = bias[c];
        double a1 = 0.0, a2 = 0.0;  // the rows in n order, each summed as reduce_rows does
        for (int64_t n = 0; n < d.N; ++n) {
            const int64_t o = (n * d.C + c) * d.S;
            double r1 = 0.0, r2 = 0.0;
            for (int64_t off = o, end = o + d.S; off < end; off += kChunk) {
                float b1, b2;
                masked_sums<T, Act>(dy, y, x, off, std::min(end - off, kChunk), m, s, b, b1, b2);
                r1 += b1;
                r2 += b2;
            }
            a1 += r1;
            a2 += r2;
        }
        const float s1 = static_cast<float>(a1), s2 = static_cast<float>(a2 * static_cast<double>(is));
        const BnElemtCoef k = bn_elemt_coef(is, w[c], s1, s2, inv_count);
        for (int64_t n = 0; n < d.N; ++n)
            elemt_row<T, Act, Shortcut>(dy, y, x, dx, ds, (n * d.C + c) * d.S, d.S, m, s, b, k);
        sum_dz[c] = s1;
        sum_dz_xhat[c] = s2;
    });
}

}  // namespace

void act_train_forward(const Tensor& x, const Tensor* shortcut, const Tensor* weight, const Tensor* bias,
                       double eps, int act, Tensor& y, Tensor& mean, Tensor& m2, Tensor& invstd,
                       bool force_strided) {
    wait_for_queued_work();
    const Dims d = dims_of(x);
    custom_assert(d.N * d.S > 1, "act_train_forward needs more than one value per channel");
    if (shortcut != nullptr)
        same_dtype(*shortcut, x, "shortcut and x");
    const int64_t elem = x.dtype().enumv() == custom::DTypeEnum::float16 ? 2 : 4;
    const int nt = channel_threads(d, d.N * d.C * d.S * elem * (shortcut != nullptr ? 2 : 1));
    if (nt == 0) {  // the unfused passes
        stats(x, mean, m2, force_strided);
        const float* q = dense_out<float>(m2);
        float* is = dense_out<float>(invstd);
        for (int64_t c = 0; c < d.C; ++c)
            is[c] = invstd_of(q[c], static_cast<double>(d.N * d.S), eps);
        act_normalize(x, shortcut, mean, invstd, weight, bias, act, y, force_strided);
        return;
    }
    const auto w = channel_values(weight, d.C, 1.f);
    const auto b = channel_values(bias, d.C, 0.f);
    dispatch(x, act, [&](auto tag, auto act_c) {
        using T = decltype(tag);
        constexpr int A = decltype(act_c)::value;
        std::vector<T> bx, bs;
        const T* px = dense<T>(x, bx, force_strided);
        float *pm = dense_out<float>(mean), *pq = dense_out<float>(m2), *pi = dense_out<float>(invstd);
        if (shortcut != nullptr)
            forward_channels<T, A, true>(nt, px, dense<T>(*shortcut, bs, force_strided), d, w.data(), b.data(), eps,
                                         dense_out<T>(y), pm, pq, pi);
        else
            forward_channels<T, A, false>(nt, px, nullptr, d, w.data(), b.data(), eps, dense_out<T>(y), pm, pq, pi);
    });
}

void act_train_backward(const Tensor& dy, const Tensor& y, const Tensor& x, const Tensor& mean, const Tensor& invstd,
                        const Tensor* weight, const Tensor* bias, int act, Tensor& dx, Tensor* dshortcut,
                        Tensor& sum_dz, Tensor& sum_dz_xhat, bool force_strided) {
    wait_for_queued_work();
    same_dtype(dy, x, "dy and x");
    same_dtype(y, x, "y and x");
    const Dims d = dims_of(x);
    custom_assert(d.N * d.S > 0, "act_train_backward needs a non-empty input");
    const int64_t elem = x.dtype().enumv() == custom::DTypeEnum::float16 ? 2 : 4;
    const bool reads_y = act == kBnActRelu || act == kBnActRelu6;
    const int nt = channel_threads(d, d.N * d.C * d.S * elem * (reads_y ? 3 : 2));
    if (nt == 0) {  // the unfused passes
        act_backward_reduce(dy, y, x, mean, invstd, weight, bias, act, sum_dz, sum_dz_xhat, force_strided);
        act_backward_elemt(dy, y, x, mean, invstd, weight, bias, sum_dz, sum_dz_xhat,
                           static_cast<double>(d.N * d.S), act, dx, dshortcut, force_strided);
        return;
    }
    const auto m = channel_values(&mean, d.C, 0.f);
    const auto is = channel_values(&invstd, d.C, 1.f);
    const auto w = channel_values(weight, d.C, 1.f);
    const auto b = channel_values(bias, d.C, 0.f);
    dispatch(x, act, [&](auto tag, auto act_c) {
        using T = decltype(tag);
        constexpr int A = decltype(act_c)::value;
        const DenseBackwardInputs<T, A> in(dy, y, x, force_strided);
        const T *pg = in.dy, *py = in.y, *px = in.x;
        float *p1 = dense_out<float>(sum_dz), *p2 = dense_out<float>(sum_dz_xhat);
        if (dshortcut != nullptr)
            backward_channels<T, A, true>(nt, pg, py, px, d, m.data(), is.data(), w.data(), b.data(),
                                          dense_out<T>(dx), dense_out<T>(*dshortcut), p1, p2);
        else
            backward_channels<T, A, false>(nt, pg, py, px, d, m.data(), is.data(), w.data(), b.data(),
                                           dense_out<T>(dx), nullptr, p1, p2);
    });
}

}  // namespace cpu
}  // namespace basebn
