// Fused BN -> activation CPU kernels: the element-wise passes of BatchNorm with the activation, and
// optionally the residual add, folded in (declared in bn_act_kernels.h; math in bn_math.h).
//
// One decomposition for the three passes: the contiguous (N, C, S) view as N*C rows of S elements,
// rows split statically over OpenMP threads (the pool stays up between calls, so a short pass costs
// microseconds, not a thread start), each row vectorised (`omp simd`) with its channel's coefficients.
// The backward reduce sums each row in float chunks of kChunk elements (each over kLanes fixed float lanes)
// into double, then the rows of a channel in n order: the result does not depend on the thread count. Without
// OpenMP (-fopenmp absent) the kernels run on one thread. Non-contiguous inputs (or force_strided) are gathered
// first.
// Threads: $BASEBN_NUM_THREADS, else OpenMP's default (OMP_NUM_THREADS, else the cores).
#include <algorithm>
#include <cstdlib>
#include <type_traits>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "bn_act_kernels.h"
#include "bn_math.h"
#include "queued_work.h"
#include "strided_copy.h"

namespace basebn {
namespace cpu {

using custom::DTypeEnum;
using custom::Tensor;

namespace {

constexpr int64_t kChunk = 4096;                 // elements per float partial sum
constexpr int kLanes = 8;                        // float lanes of a partial sum (masked_sums)
constexpr int64_t kMinElemsPerThread = 1 << 15;  // below this a second thread costs more than it saves

int thread_cap() {
    const char* env = std::getenv("BASEBN_NUM_THREADS");
    const int v = env != nullptr ? std::atoi(env) : 0;
#ifdef _OPENMP
    static const int detected = omp_get_max_threads();
    return v > 0 ? v : detected;
#else
    (void)v;
    return 1;
#endif
}

// f(r) for every row r in [0, rows) of S elements, rows split statically over the threads
template <class F>
void for_rows(int64_t rows, int64_t S, F&& f) {
    int64_t nt = std::min<int64_t>(thread_cap(), rows);
    nt = std::max<int64_t>(1, std::min<int64_t>(nt, rows * S / kMinElemsPerThread));
    const int threads = static_cast<int>(nt);
    (void)threads;  // (unused without OpenMP)
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int64_t r = 0; r < rows; ++r)
        f(r);
}

// t's elements in row-major order: t's memory, or a gathered copy in buf
template <typename T>
const T* dense(const Tensor& t, std::vector<T>& buf, bool force) {
    return t.is_contiguous() && !force ? t.data<T>() : gather_strided(t, buf);
}

// a per-channel float32 tensor as a vector of C values (fill when t is nullptr)
std::vector<float> channel_values(const Tensor* t, int64_t C, float fill) {
    std::vector<float> v(C, fill);
    if (t != nullptr) {
        custom_assert(static_cast<int64_t>(t->size()) == C, "per-channel tensor has %zu elements, expected %lld",
                      t->size(), static_cast<long long>(C));
        gather_strided(*t, v);
    }
    return v;
}

// bn_normalize_elem's per-channel scale (invstd * weight) and bias, weight 1 / bias 0 when absent
struct ChannelAffine {
    std::vector<float> scale, bias;
};

ChannelAffine channel_affine(const std::vector<float>& invstd, const Tensor* weight, const Tensor* bias,
                             int64_t C) {
    const auto w = channel_values(weight, C, 1.f);
    ChannelAffine a{std::vector<float>(C), channel_values(bias, C, 0.f)};
    for (int64_t c = 0; c < C; ++c)
        a.scale[c] = bn_norm_scale(invstd[c], w[c]);
    return a;
}

template <typename T>
T* dense_out(Tensor& t) {
    custom_assert(t.is_contiguous() || t.size() == 0, "output tensor is not contiguous");
    return t.data<T>();
}

// f(T(), Act()) for x's dtype (float, or uint16_t = float16 bits) and the activation code `act`
template <class F>
void dispatch(const Tensor& x, int act, F&& f) {
    const auto e = x.dtype().enumv();
    custom_assert(e == DTypeEnum::float32 || e == DTypeEnum::float16, "x must be float32 or float16, got %s",
                  x.dtype().str().c_str());
    auto with_act = [&](auto tag) {
        if (act == kBnActIdentity)
            f(tag, std::integral_constant<int, kBnActIdentity>());
        else if (act == kBnActRelu)
            f(tag, std::integral_constant<int, kBnActRelu>());
        else if (act == kBnActRelu6)
            f(tag, std::integral_constant<int, kBnActRelu6>());
        else if (act == kBnActSilu)
            f(tag, std::integral_constant<int, kBnActSilu>());
        else if (act == kBnActHswish)
            f(tag, std::integral_constant<int, kBnActHswish>());
        else
            custom_assert(false, "unknown activation code %d", act);
    };
    if (e == DTypeEnum::float16)
        with_act(uint16_t());
    else
        with_act(float());
}

void same_dtype(const Tensor& a, const Tensor& b, const char* what) {
    custom_assert(a.dtype().enumv() == b.dtype().enumv(), "%s dtypes differ", what);
}

// ------------------------------------------------------------------ passes on dense (N, C, S)
template <typename T, int Act, bool Add>
void normalize_rows(const T* x, const T* sc, const Dims& d, const float* mean, const float* scale,
                    const float* bias, T* y) {
    // (pointers captured by value: a by-reference capture is reloaded in the loop, which stops vectorisation)
    for_rows(d.N * d.C, d.S, [=](int64_t r) {
        const int64_t c = r % d.C, o = r * d.S;
        const float m = mean[c], s = scale[c], b = bias[c];
#pragma omp simd
        for (int64_t i = o; i < o + d.S; ++i) {
            float v = bn_normalize_elem(BnIO<T>::load(x[i]), m, s, b);
            if (Add)
                v += BnIO<T>::load(sc[i]);
            y[i] = BnIO<T>::store(bn_act_apply<Act>(v));
        }
    });
}

// dz = act'(pre) * dy at element i (bn_act_grad): act' read from y (ReLU, ReLU6; y unused otherwise), or from
// pre = (x - m) * s + b recomputed as the forward did (SiLU, HSwish: bn_act_from_pre), m / s / b the channel's
// mean, scale (invstd * weight) and bias
template <typename T, int Act>
inline float act_grad(const T* dy, const T* y, const T* x, int64_t i, float m, float s, float b) {
    const float g = BnIO<T>::load(dy[i]);
    if (Act == kBnActIdentity)
        return g;
    if (bn_act_from_pre(Act))
        return bn_act_grad<Act>(g, bn_normalize_elem(BnIO<T>::load(x[i]), m, s, b));
    return bn_act_grad<Act>(g, BnIO<T>::load(y[i]));
}

// (sum dz, sum dz * (x - m)) over the elements [o, o + len) (len <= kChunk) in float, dz = act_grad: element
// o + j into lane j % kLanes, then the lanes in order. The order is the source's, not the vector width's or the
// thread count's; one pass, the lanes held in vector registers (two 4-wide per sum), as the plain reduce.
template <typename T, int Act>
inline void masked_sums(const T* dy, const T* y, const T* x, int64_t o, int64_t len, float m, float s, float b,
                        float& s1, float& s2) {
    float l1[kLanes] = {}, l2[kLanes] = {};
    int64_t j = 0;
    for (; j + kLanes <= len; j += kLanes) {
#pragma omp simd
        for (int l = 0; l < kLanes; ++l) {
            const int64_t i = o + j + l;
            const float g = act_grad<T, Act>(dy, y, x, i, m, s, b);
            l1[l] += g;
            l2[l] += g * (BnIO<T>::load(x[i]) - m);
        }
    }
    for (int l = 0; l < kLanes; ++l) {  // the tail (fewer than kLanes elements) into the first lanes
        if (j + l < len) {
            const float g = act_grad<T, Act>(dy, y, x, o + j + l, m, s, b);
            l1[l] += g;
            l2[l] += g * (BnIO<T>::load(x[o + j + l]) - m);
        }
    }
    s1 = 0.f;
    s2 = 0.f;
    for (int l = 0; l < kLanes; ++l) {
        s1 += l1[l];
        s2 += l2[l];
    }
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
        const BnElemtCoef k = coef[c];
        const float m = mean[c], s = scale[c], b = bias[c];
#pragma omp simd
        for (int64_t i = o; i < o + d.S; ++i) {
            const float g = act_grad<T, Act>(dy, y, x, i, m, s, b);
            dx[i] = BnIO<T>::store(bn_elemt_elem(g, BnIO<T>::load(x[i]), m, k));
            if (Shortcut)
                ds[i] = BnIO<T>::store(g);
        }
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
            std::vector<T> bg, by, bx;
            const T* py = A == kBnActIdentity || bn_act_from_pre(A) ? nullptr : dense<T>(y, by, force_strided);
            reduce_rows<T, A>(dense<T>(dy, bg, force_strided), py, dense<T>(x, bx, force_strided), d, m.data(),
                              aff.scale.data(), aff.bias.data(), a1.data(), a2.data());
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
        std::vector<T> bg, by, bx;
        const T* pg = dense<T>(dy, bg, force_strided);
        const T* py = A == kBnActIdentity || bn_act_from_pre(A) ? nullptr : dense<T>(y, by, force_strided);
        const T* px = dense<T>(x, bx, force_strided);
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
