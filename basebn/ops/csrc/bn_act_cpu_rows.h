// The helpers of the fused BN -> activation CPU kernels, shared by the element-wise passes (bn_act_cpu.cpp) and
// the one-call training passes (bn_train_cpu.cpp), so both give the same bits: the thread plan over rows, dense
// views of the inputs, per-channel values, the dtype x activation dispatch, dz = act'(pre) * dy, and the
// lane-ordered partial sums of dz and dz * (x - mean) over a chunk of a row.
// Threads: $BASEBN_NUM_THREADS, else OpenMP's default (OMP_NUM_THREADS, else the cores).
#pragma once

#include <algorithm>
#include <cstdlib>
#include <type_traits>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "bn_kernels.h"
#include "bn_math.h"
#include "strided_copy.h"
#include "thread_env.h"

namespace basebn {
namespace cpu {
namespace act_rows {

using custom::DTypeEnum;
using custom::Tensor;

constexpr int64_t kChunk = 4096;                 // elements per float partial sum
constexpr int kLanes = 8;                        // float lanes of a partial sum (masked_sums)
constexpr int64_t kMinElemsPerThread = 1 << 15;  // below this a second thread costs more than it saves

inline int thread_cap() {  // $BASEBN_NUM_THREADS (thread_env.h), else OpenMP's default
    const int v = env_threads();
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
inline void for_rows(int64_t rows, int64_t S, F&& f) {
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
inline std::vector<float> channel_values(const Tensor* t, int64_t C, float fill) {
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

inline ChannelAffine channel_affine(const std::vector<float>& invstd, const Tensor* weight, const Tensor* bias,
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

// dy, y and x of a backward as dense arrays (gathered when not contiguous); y only where act' reads it
// (ReLU, ReLU6: nullptr otherwise)
template <typename T, int Act>
struct DenseBackwardInputs {
    std::vector<T> buf_dy, buf_y, buf_x;  // (declared first: the pointers below may point into them)
    const T* dy;
    const T* y;
    const T* x;
    DenseBackwardInputs(const Tensor& dy_t, const Tensor& y_t, const Tensor& x_t, bool force)
            : dy(dense<T>(dy_t, buf_dy, force)),
              y(Act == kBnActIdentity || bn_act_from_pre(Act) ? nullptr : dense<T>(y_t, buf_y, force)),
              x(dense<T>(x_t, buf_x, force)) {}
};

// f(T(), Act()) for x's dtype (float, or uint16_t = float16 bits) and the activation code `act`
template <class F>
inline void dispatch(const Tensor& x, int act, F&& f) {
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

inline void same_dtype(const Tensor& a, const Tensor& b, const char* what) {
    custom_assert(a.dtype().enumv() == b.dtype().enumv(), "%s dtypes differ", what);
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

// y = act((x - m) * s + b [+ sc]) over the elements [o, o + S) of a row
template <typename T, int Act, bool Add>
inline void normalize_row(const T* x, const T* sc, T* y, int64_t o, int64_t S, float m, float s, float b) {
#pragma omp simd
    for (int64_t i = o; i < o + S; ++i) {
        float v = bn_normalize_elem(BnIO<T>::load(x[i]), m, s, b);
        if (Add)
            v += BnIO<T>::load(sc[i]);
        y[i] = BnIO<T>::store(bn_act_apply<Act>(v));
    }
}

// dx = bn_elemt_elem(dz, x) [and ds = dz] over the elements [o, o + S) of a row, dz = act_grad
template <typename T, int Act, bool Shortcut>
inline void elemt_row(const T* dy, const T* y, const T* x, T* dx, T* ds, int64_t o, int64_t S, float m, float s,
                      float b, const BnElemtCoef& k) {
#pragma omp simd
    for (int64_t i = o; i < o + S; ++i) {
        const float g = act_grad<T, Act>(dy, y, x, i, m, s, b);
        dx[i] = BnIO<T>::store(bn_elemt_elem(g, BnIO<T>::load(x[i]), m, k));
        if (Shortcut)
            ds[i] = BnIO<T>::store(g);
    }
}

}  // namespace act_rows
}  // namespace cpu
}  // namespace basebn
