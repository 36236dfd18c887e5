// Fused BN -> activation CPU kernels: the element-wise passes of BatchNorm with the activation, and
// optionally the residual add, folded in (declared in bn_act_kernels.h; math in bn_math.h).
//
// One decomposition for the three passes: the contiguous (N, C, S) view as N*C rows of S elements,
// rows split statically over OpenMP threads (the pool stays up between calls, so a short pass costs
// microseconds, not a thread start), each row vectorised (`omp simd`) with its channel's coefficients.
// The backward reduce sums each row in float chunks of kChunk elements (each over kLanes fixed float lanes)
// into double, then the rows of a channel in n order: the result does not depend on the thread count. Without
// OpenMP (-fopenmp absent) the kernels run on one thread. Non-contiguous inputs (or force_strided) are gathered
// first. Threads, and the helpers shared with bn_train_cpu.cpp: bn_act_cpu_rows.h.
#include <algorithm>
#include <vector>

#include "bn_act_cpu_rows.h"
#include "bn_act_kernels.h"
#include "bn_math.h"
#include "queued_work.h"

namespace basebn {
namespace cpu {

using custom::DTypeEnum;
using custom::Tensor;

namespace {

using namespace act_rows;

// ------------------------------------------------------------------ passes on dense (N, C, S)
template <typename T, int Act, bool Add>
void normalize_rows(const T* x, const T* sc, const Dims& d, const float* mean, const float* scale,
                    const float* bias, T* y) {
    // (pointers captured by value: a by-reference capture is reloaded in the loop, which stops vectorisation)
    for_rows(d.N * d.C, d.S, [=](int64_t r) {
        const int64_t c = r % d.C, o = r * d.S;
        normalize_row<T, Act, Add>(x, sc, y, o, d.S, mean[c], scale[c], bias[c]);
    });
}

template <typename T, int Act>
void reduce_rows(const T* dy, const T* y, const T* x, const Dims& d, const float* mean, const float* scale,
                 const float* bias, double* sum_dz, double* sum_dz_xc) {
    const int64_t R = d.N * d.C;
    std::vector<double> r1(R), r2(R);
    double* p1 = r1.data();
    double* p2 = r2.data();
    for_rows(R, d.S, [=](int64_t r) {
        const int64_t c = r % d.C;
        const float m = mean[c], s = scale[c], b = bias[c];
        double a1 = 0.0, a2 = 0.0;
        for (int64_t off = r * d.S, end = (r + 1) * d.S; off < end; off += kChunk) {
            float b1, b2;
            masked_sums<T, Act>(dy, y, x, off, std::min(end - off, kChunk), m, s, b, b1, b2);
            a1 += b1;
            a2 += b2;
        }
        p1[r] = a1;
        p2[r] = a2;
    });
    std::fill(sum_dz, sum_dz + d.C, 0.0);  // the rows of each channel in n order: independent of the threads
    std::fill(sum_dz_xc, sum_dz_xc + d.C, 0.0);
    for (int64_t r = 0; r < R; ++r) {
        sum_dz[r % d.C] += r1[r];
        sum_dz_xc[r % d.C] += r2[r];
    }
}

template <typename T, int Act, bool Shortcut>
void elemt_rows(const T* dy, const T* y, const T* x, const Dims& d, const float* mean, const float* scale,
                const float* bias, const BnElemtCoef* coef, T* dx, T* ds) {
    for_rows(d.N * d.C, d.S, [=](int64_t r) {
        const int64_t c = r % d.C, o = r * d.S;
        elemt_row<T, Act, Shortcut>(dy, y, x, dx, ds, o, d.S, mean[c], scale[c], bias[c], coef[c]);
    });
}

}  // namespace

// ------------------------------------------------------------------ entry points
void act_normalize(const Tensor& x, const Tensor* shortcut, const Tensor& mean, const Tensor& invstd,
                   const Tensor* weight, const Tensor* bias, int act, Tensor& y, bool force_strided) {
    wait_for_queued_work();
    const Dims d = dims_of(x);
    if (shortcut != nullptr)
        same_dtype(*shortcut, x, "shortcut and x");
    if (x.size() == 0)
        return;
    const auto m = channel_values(&mean, d.C, 0.f);
    const auto aff = channel_affine(channel_values(&invstd, d.C, 1.f), weight, bias, d.C);
    dispatch(x, act, [&](auto tag, auto act_c) {
        using T = decltype(tag);
        constexpr int A = decltype(act_c)::value;
        std::vector<T> bx, bs;
        const T* px = dense<T>(x, bx, force_strided);
        if (shortcut != nullptr)
            normalize_rows<T, A, true>(px, dense<T>(*shortcut, bs, force_strided), d, m.data(),
                                       aff.scale.data(), aff.bias.data(), dense_out<T>(y));
        else
            normalize_rows<T, A, false>(px, nullptr, d, m.data(), aff.scale.data(), aff.bias.data(),
                                        dense_out<T>(y));
    });
}

void act_backward_reduce(const Tensor& dy, const Tensor& y, const Tensor& x, const Tensor& mean,
                         const Tensor& invstd, const Tensor* weight, const Tensor* bias, int act, Tensor& sum_dz,
                         Tensor& sum_dz_xhat, bool force_strided) {
    wait_for_queued_work();
    same_dtype(dy, x, "dy and x");
    same_dtype(y, x, "y and x");
    const Dims d = dims_of(x);
    float* p1 = dense_out<float>(sum_dz);
    float* p2 = dense_out<float>(sum_dz_xhat);
    std::vector<double> a1(d.C, 0.0), a2(d.C, 0.0);
    const auto is = channel_values(&invstd, d.C, 1.f);
    if (x.size() > 0) {
        const auto m = channel_values(&mean, d.C, 0.f);
        const auto aff = channel_affine(is, weight, bias, d.C);
        dispatch(x, act, [&](auto tag, auto act_c) {
            using T = decltype(tag);
            constexpr int A = decltype(act_c)::value;
            const DenseBackwardInputs<T, A> in(dy, y, x, force_strided);
            reduce_rows<T, A>(in.dy, in.y, in.x, d, m.data(), aff.scale.data(), aff.bias.data(), a1.data(),
                              a2.data());
        });
    }
    for (int64_t c = 0; c < d.C; ++c) {
        p1[c] = static_cast<float>(a1[c]);
        p2[c] = static_cast<float>(a2[c] * static_cast<double>(is[c]));
    }
}

void act_backward_elemt(const Tensor& dy, const Tensor& y, const Tensor& x, const Tensor& mean,
                        const Tensor& invstd, const Tensor* weight, const Tensor* bias, const Tensor& sum_dz,
                        const Tensor& sum_dz_xhat, double count, int act, Tensor& dx, Tensor* dshortcut,
                        bool force_strided) {
    wait_for_queued_work();
    same_dtype(dy, x, "dy and x");
    same_dtype(y, x, "y and x");
    const Dims d = dims_of(x);
    if (x.size() == 0)
        return;
    const auto m = channel_values(&mean, d.C, 0.f);
    const auto is = channel_values(&invstd, d.C, 1.f);
    const auto w = channel_values(weight, d.C, 1.f);
    const auto aff = channel_affine(is, weight, bias, d.C);
    const auto s1 = channel_values(&sum_dz, d.C, 0.f);
    const auto s2 = channel_values(&sum_dz_xhat, d.C, 0.f);
    const double inv_count = count > 0.0 ? 1.0 / count : 0.0;
    std::vector<BnElemtCoef> coef(d.C);
    for (int64_t c = 0; c < d.C; ++c)
        coef[c] = bn_elemt_coef(is[c], w[c], s1[c], s2[c], inv_count);
    dispatch(x, act, [&](auto tag, auto act_c) {
        using T = decltype(tag);
        constexpr int A = decltype(act_c)::value;
        const DenseBackwardInputs<T, A> in(dy, y, x, force_strided);
        const T *pg = in.dy, *py = in.y, *px = in.x;
        const float *ps = aff.scale.data(), *pb = aff.bias.data();
        if (dshortcut != nullptr)
            elemt_rows<T, A, true>(pg, py, px, d, m.data(), ps, pb, coef.data(), dense_out<T>(dx),
                                   dense_out<T>(*dshortcut));
        else
            elemt_rows<T, A, false>(pg, py, px, d, m.data(), ps, pb, coef.data(), dense_out<T>(dx), nullptr);
    });
}

}  // namespace cpu
}  // namespace basebn
