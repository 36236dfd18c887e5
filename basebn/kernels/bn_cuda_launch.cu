// Launchers of the CUDA BatchNorm kernels (bn_cuda_kernels.cuh) behind the C API of bn_cuda_launch.h:
// raw pointers, sizes, strides and a stream. No MegEngine header: builds alone with nvcc
// (nvcc -shared -Xcompiler -fPIC bn_cuda_launch.cu; see benchmarks/cuda/run_harness.py).
#include "bn_cuda_launch.h"

#include <type_traits>

#include "bn_cuda_kernels.cuh"

namespace basebn {
namespace cuda {
namespace {

using kern::kElemThreads;
using kern::kReduceThreads;

struct Dims3 {
    int64_t N, C, S;
};

bool valid(const BasebnBnTensor* t) {
    if (t == nullptr || t->ndim < 2 || t->ndim > BASEBN_BN_MAX_DIMS)
        return false;
    if (t->dtype != BASEBN_BN_FLOAT32 && t->dtype != BASEBN_BN_FLOAT16)
        return false;
    for (int i = 0; i < t->ndim; ++i)
        if (t->shape[i] < 0)
            return false;
    return true;
}

bool same_shape(const BasebnBnTensor* a, const BasebnBnTensor* b) {
    if (a->ndim != b->ndim || a->dtype != b->dtype)
        return false;
    for (int i = 0; i < a->ndim; ++i)
        if (a->shape[i] != b->shape[i])
            return false;
    return true;
}

Dims3 dims_of(const BasebnBnTensor* t) {
    Dims3 d{t->shape[0], t->shape[1], 1};
    for (int i = 2; i < t->ndim; ++i)
        d.S *= t->shape[i];
    return d;
}

BnLayout layout_of(const BasebnBnTensor* t) {
    BnLayout L;
    L.ndim = t->ndim;
    for (int i = 0; i < 5; ++i) {
        L.shape[i] = i < t->ndim ? t->shape[i] : 1;
        L.stride[i] = i < t->ndim ? t->stride[i] : 0;
    }
    return L;
}

// Row-major (N, C, *) with no gaps (strides of size-1 dims do not matter).
bool is_contiguous(const BasebnBnTensor* t) {
    int64_t expect = 1;
    for (int i = t->ndim - 1; i >= 0; --i) {
        if (t->shape[i] != 1 && t->stride[i] != expect)
            return false;
        expect *= t->shape[i];
    }
    return true;
}

int64_t numel(const Dims3& d) {
    return d.N * d.C * d.S;
}

// threads: x over S (the power of two >= S, at most 512), y over N (blockDim.x * blockDim.y = 512 always).
// A small S leaves no x-thread idle: 2D (N, C) input gets 1 x 512 threads, not 32 x 16 (31 of 32 idle).
dim3 reduce_block(int64_t S) {
    int bx = 1;
    while (bx < kReduceThreads && bx < S)
        bx <<= 1;
    return dim3(bx, kReduceThreads / bx);
}

unsigned reduce_grid(const Dims3& d) {
    return static_cast<unsigned>(d.C < 65535 ? d.C : 65535);
}

dim3 elem_grid(const Dims3& d) {
    const int64_t per_c = d.N * d.S;
    int64_t gx = (per_c + kElemThreads - 1) / kElemThreads;
    const int64_t target = 4096;  // total blocks to aim for
    const int64_t cap = d.C >= target ? 1 : (target + d.C - 1) / d.C;
    gx = gx < 1 ? 1 : (gx > cap ? cap : gx);
    const int64_t gy = d.C < 65535 ? d.C : 65535;
    return dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy));
}

// the per-channel sums of an empty batch: zeros (nothing to do without channels)
cudaError_t zero_channels(float* a, float* b, int64_t C, cudaStream_t stream) {
    if (C == 0)
        return cudaSuccess;
    cudaError_t err = cudaMemsetAsync(a, 0, sizeof(float) * C, stream);
    if (err == cudaSuccess)
        err = cudaMemsetAsync(b, 0, sizeof(float) * C, stream);
    return err;
}

// f(T(), Contig()) with T = float or uint16_t (float16 bits) and Contig = std::integral_constant<bool, contig>:
// the kernel template arguments of one launch, chosen at run time
template <typename F>
void dispatch(int dtype, bool contig, F&& f) {
    auto with_layout = [&](auto tag) {
        if (contig)
            f(tag, std::true_type());
        else
            f(tag, std::false_type());
    };
    if (dtype == BASEBN_BN_FLOAT32)
        with_layout(float());
    else
        with_layout(uint16_t());
}

}  // namespace
}  // namespace cuda
}  // namespace basebn

using namespace basebn::cuda;

extern "C" cudaError_t basebn_bn_cuda_stats(
        const BasebnBnTensor* x, float* mean, float* m2, int force_strided, cudaStream_t stream) {
    if (!valid(x) || mean == nullptr || m2 == nullptr)
        return cudaErrorInvalidValue;
    const Dims3 d = dims_of(x);
    if (numel(d) == 0)  // also C == 0
        return zero_channels(mean, m2, d.C, stream);
    if (x->data == nullptr)
        return cudaErrorInvalidValue;
    const basebn::BnLayout L = layout_of(x);
    const bool contig = is_contiguous(x) && !force_strided;
    dispatch(x->dtype, contig, [&](auto tag, auto contiguous) {
        using T = decltype(tag);
        const T* px = static_cast<const T*>(x->data);
        kern::stats_kernel<T, decltype(contiguous)::value><<<reduce_grid(d), reduce_block(d.S), 0, stream>>>(
                px, L, d.N, d.C, d.S, mean, m2);
    });
    return cudaGetLastError();
}

// ------------------------------------------------------------------ fused BN -> activation
namespace basebn {
namespace cuda {
namespace {

bool valid_act(int act) {
    return act == kBnActIdentity || act == kBnActRelu || act == kBnActRelu6 || act == kBnActSilu ||
           act == kBnActHswish;
}

// f(T(), Contig(), Act()) for the run-time dtype, layout and activation code (valid_act checked)
template <typename F>
void dispatch_act(int dtype, bool contig, int act, F&& f) {
    dispatch(dtype, contig, [&](auto tag, auto contiguous) {
        if (act == kBnActRelu)
            f(tag, contiguous, std::integral_constant<int, kBnActRelu>());
        else if (act == kBnActRelu6)
            f(tag, contiguous, std::integral_constant<int, kBnActRelu6>());
        else if (act == kBnActSilu)
            f(tag, contiguous, std::integral_constant<int, kBnActSilu>());
        else if (act == kBnActHswish)
            f(tag, contiguous, std::integral_constant<int, kBnActHswish>());
        else
            f(tag, contiguous, std::integral_constant<int, kBnActIdentity>());
    });
}

// y of an act backward: x's shape and dtype, or NULL where it is not read (identity, SiLU, HSwish: then x's
// layout stands in)
bool valid_output_like(const BasebnBnTensor* y, const BasebnBnTensor* x, int act) {
    if ((act == kBnActIdentity || bn_act_from_pre(act)) && y == nullptr)
        return true;
    return valid(y) && same_shape(y, x) && (y->data != nullptr || numel(dims_of(x)) == 0);
}

}  // namespace
}  // namespace cuda
}  // namespace basebn

extern "C" cudaError_t basebn_bn_cuda_act_normalize(
        const BasebnBnTensor* x, const BasebnBnTensor* shortcut, const float* mean, const float* invstd,
        const float* weight, const float* bias, int act, void* y, int force_strided, cudaStream_t stream) {
    if (!valid(x) || !valid_act(act) || (shortcut != nullptr && !(valid(shortcut) && same_shape(shortcut, x))))
        return cudaErrorInvalidValue;
    const Dims3 d = dims_of(x);
    if (numel(d) == 0)
        return cudaSuccess;
    if (x->data == nullptr || mean == nullptr || invstd == nullptr || y == nullptr ||
        (shortcut != nullptr && shortcut->data == nullptr))
        return cudaErrorInvalidValue;
    const basebn::BnLayout L = layout_of(x), Ls = layout_of(shortcut != nullptr ? shortcut : x);
    const bool contig = is_contiguous(x) && (shortcut == nullptr || is_contiguous(shortcut)) && !force_strided;
    dispatch_act(x->dtype, contig, act, [&](auto tag, auto contiguous, auto act_c) {
        using T = decltype(tag);
        constexpr bool C = decltype(contiguous)::value;
        constexpr int A = decltype(act_c)::value;
        const T* px = static_cast<const T*>(x->data);
        T* py = static_cast<T*>(y);
        if (shortcut != nullptr)
            kern::act_normalize_kernel<T, C, A, true><<<elem_grid(d), kElemThreads, 0, stream>>>(
                    px, L, static_cast<const T*>(shortcut->data), Ls, d.N, d.C, d.S, mean, invstd, weight, bias, py);
        else
            kern::act_normalize_kernel<T, C, A, false><<<elem_grid(d), kElemThreads, 0, stream>>>(
                    px, L, nullptr, Ls, d.N, d.C, d.S, mean, invstd, weight, bias, py);
    });
    return cudaGetLastError();
}

extern "C" cudaError_t basebn_bn_cuda_act_backward_reduce(
        const BasebnBnTensor* dy, const BasebnBnTensor* y, const BasebnBnTensor* x, const float* mean,
        const float* invstd, const float* weight, const float* bias, int act, float* sum_dz, float* sum_dz_xhat,
        int force_strided, cudaStream_t stream) {
    if (!valid(x) || !valid(dy) || !same_shape(dy, x) || !valid_act(act) || !valid_output_like(y, x, act) ||
        sum_dz == nullptr || sum_dz_xhat == nullptr)
        return cudaErrorInvalidValue;
    const Dims3 d = dims_of(x);
    if (numel(d) == 0)  // also C == 0
        return zero_channels(sum_dz, sum_dz_xhat, d.C, stream);
    if (x->data == nullptr || dy->data == nullptr || mean == nullptr || invstd == nullptr)
        return cudaErrorInvalidValue;
    const BasebnBnTensor* yv = y != nullptr ? y : x;
    const basebn::BnLayout Lg = layout_of(dy), Ly = layout_of(yv), Lx = layout_of(x);
    const bool contig = is_contiguous(dy) && is_contiguous(yv) && is_contiguous(x) && !force_strided;
    dispatch_act(x->dtype, contig, act, [&](auto tag, auto contiguous, auto act_c) {
        using T = decltype(tag);
        kern::act_backward_reduce_kernel<T, decltype(contiguous)::value, decltype(act_c)::value>
                <<<reduce_grid(d), reduce_block(d.S), 0, stream>>>(
                        static_cast<const T*>(dy->data), Lg, static_cast<const T*>(yv->data), Ly,
                        static_cast<const T*>(x->data), Lx, d.N, d.C, d.S, mean, invstd, weight, bias, sum_dz,
                        sum_dz_xhat);
    });
    return cudaGetLastError();
}

extern "C" cudaError_t basebn_bn_cuda_act_backward_elemt(
        const BasebnBnTensor* dy, const BasebnBnTensor* y, const BasebnBnTensor* x, const float* mean,
        const float* invstd, const float* weight, const float* bias, const float* sum_dz, const float* sum_dz_xhat,
        double count, int act, void* dx, void* dshortcut, int force_strided, cudaStream_t stream) {
    if (!valid(x) || !valid(dy) || !same_shape(dy, x) || !valid_act(act) || !valid_output_like(y, x, act))
        return cudaErrorInvalidValue;
    const Dims3 d = dims_of(x);
    if (numel(d) == 0)
        return cudaSuccess;
    if (x->data == nullptr || dy->data == nullptr || mean == nullptr || invstd == nullptr ||
        sum_dz == nullptr || sum_dz_xhat == nullptr || dx == nullptr)
        return cudaErrorInvalidValue;
    const BasebnBnTensor* yv = y != nullptr ? y : x;
    const basebn::BnLayout Lg = layout_of(dy), Ly = layout_of(yv), Lx = layout_of(x);
    const bool contig = is_contiguous(dy) && is_contiguous(yv) && is_contiguous(x) && !force_strided;
    const double inv_count = count > 0.0 ? 1.0 / count : 0.0;
    dispatch_act(x->dtype, contig, act, [&](auto tag, auto contiguous, auto act_c) {
        using T = decltype(tag);
        constexpr bool C = decltype(contiguous)::value;
        constexpr int A = decltype(act_c)::value;
        const T* pg = static_cast<const T*>(dy->data);
        const T* py = static_cast<const T*>(yv->data);
        const T* px = static_cast<const T*>(x->data);
        if (dshortcut != nullptr)
            kern::act_backward_elemt_kernel<T, C, A, true><<<elem_grid(d), kElemThreads, 0, stream>>>(
                    pg, Lg, py, Ly, px, Lx, d.N, d.C, d.S, mean, invstd, weight, bias, sum_dz, sum_dz_xhat, inv_count,
                    static_cast<T*>(dx), static_cast<T*>(dshortcut));
        else
            kern::act_backward_elemt_kernel<T, C, A, false><<<elem_grid(d), kElemThreads, 0, stream>>>(
                    pg, Lg, py, Ly, px, Lx, d.N, d.C, d.S, mean, invstd, weight, bias, sum_dz, sum_dz_xhat, inv_count,
                    static_cast<T*>(dx), nullptr);
    });
    return cudaGetLastError();
}

// ------------------------------------------------------------------ plain BN passes: the identity activation
extern "C" cudaError_t basebn_bn_cuda_normalize(
        const BasebnBnTensor* x, const float* mean, const float* invstd, const float* weight,
        const float* bias, void* y, int force_strided, cudaStream_t stream) {
    return basebn_bn_cuda_act_normalize(x, nullptr, mean, invstd, weight, bias, basebn::kBnActIdentity, y, force_strided,
                                        stream);
}

extern "C" cudaError_t basebn_bn_cuda_backward_reduce(
        const BasebnBnTensor* dy, const BasebnBnTensor* x, const float* mean, const float* invstd,
        float* sum_dy, float* sum_dy_xhat, int force_strided, cudaStream_t stream) {
    return basebn_bn_cuda_act_backward_reduce(dy, nullptr, x, mean, invstd, nullptr, nullptr, basebn::kBnActIdentity, sum_dy,
                                              sum_dy_xhat, force_strided, stream);
}

extern "C" cudaError_t basebn_bn_cuda_backward_elemt(
        const BasebnBnTensor* dy, const BasebnBnTensor* x, const float* mean, const float* invstd,
        const float* weight, const float* sum_dy, const float* sum_dy_xhat, double count, void* dx,
        int force_strided, cudaStream_t stream) {
    return basebn_bn_cuda_act_backward_elemt(dy, nullptr, x, mean, invstd, weight, nullptr, sum_dy, sum_dy_xhat, count,
                                             basebn::kBnActIdentity, dx, nullptr, force_strided, stream);
}
