// CUDA BatchNorm kernels (compiled and registered only when building with -DBASEBN_WITH_CUDA).
//
// One design for both reductions (stats, backward reduce): one thread block per channel,
// threads laid out (x over the contiguous spatial axis, y over N); every thread accumulates its
// strided share (Welford for the moments, float sums for the gradients), then the block merges
// with warp shuffles and shared memory (Chan's formula for the moments).
// Element-wise kernels (normalize, backward elemt): grid.y walks channels, grid.x/threads walk
// the N*S elements of a channel; per-channel coefficients are computed once per thread.
// Non-contiguous inputs (or force_strided) use bn_offset() on the real strides.
#include <cuda_runtime.h>

#include "bn_kernels.h"
#include "bn_math.h"
#include "megbrain/custom/platform/custom_cuda.h"

namespace basebn {
namespace cuda {

using custom::DTypeEnum;
using custom::Tensor;

namespace {

constexpr int kReduceThreads = 512;
constexpr int kElemThreads = 256;
constexpr int kMaxWarps = kReduceThreads / 32;
constexpr unsigned kFullMask = 0xffffffffu;

BnLayout layout_of(const Tensor& t) {
    BnLayout L;
    const auto sh = t.shape();
    const auto st = t.stride();
    L.ndim = static_cast<int>(sh.ndim());
    custom_assert(L.ndim >= 2 && L.ndim <= 5, "basebn BN kernels take 2 to 5 dims");
    for (int i = 0; i < 5; ++i) {
        L.shape[i] = i < L.ndim ? static_cast<int64_t>(sh[i]) : 1;
        L.stride[i] = i < L.ndim ? static_cast<int64_t>(st[i]) : 0;
    }
    return L;
}

void check_launch(const char* what) {
    const cudaError_t err = cudaGetLastError();
    custom_assert(err == cudaSuccess, "%s: %s", what, cudaGetErrorString(err));
}

// threads: x over S (power of two, 32..512), y over N
dim3 reduce_block(int64_t S) {
    int bx = 32;
    while (bx < kReduceThreads && bx < S)
        bx <<= 1;
    return dim3(bx, kReduceThreads / bx);
}

template <bool Contig>
__device__ __forceinline__ int64_t elem_offset(
        const BnLayout& L, int64_t n, int64_t c, int64_t s, int64_t C, int64_t S) {
    return Contig ? (n * C + c) * S + s : bn_offset(L, n, c, s);
}

// ------------------------------------------------------------------ block merges
__device__ __forceinline__ void warp_merge_moments(float& n, float& mean, float& m2) {
    for (int off = 16; off > 0; off >>= 1) {
        const float n2 = __shfl_down_sync(kFullMask, n, off);
        const float mean2 = __shfl_down_sync(kFullMask, mean, off);
        const float m22 = __shfl_down_sync(kFullMask, m2, off);
        bn_chan_merge<float>(n, mean, m2, n2, mean2, m22);
    }
}

__device__ __forceinline__ void warp_sum2(float& a, float& b) {
    for (int off = 16; off > 0; off >>= 1) {
        a += __shfl_down_sync(kFullMask, a, off);
        b += __shfl_down_sync(kFullMask, b, off);
    }
}

// After the call, thread 0 holds the block result. blockDim.x * blockDim.y == kReduceThreads.
__device__ void block_merge_moments(float& n, float& mean, float& m2) {
    __shared__ float sh_n[kMaxWarps], sh_mean[kMaxWarps], sh_m2[kMaxWarps];
    const int tid = threadIdx.y * blockDim.x + threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5;
    warp_merge_moments(n, mean, m2);
    if (lane == 0) {
        sh_n[warp] = n;
        sh_mean[warp] = mean;
        sh_m2[warp] = m2;
    }
    __syncthreads();
    if (warp == 0) {
        const int nwarps = (blockDim.x * blockDim.y) >> 5;
        n = lane < nwarps ? sh_n[lane] : 0.f;
        mean = lane < nwarps ? sh_mean[lane] : 0.f;
        m2 = lane < nwarps ? sh_m2[lane] : 0.f;
        warp_merge_moments(n, mean, m2);
    }
}

__device__ void block_sum2(float& a, float& b) {
    __shared__ float sh_a[kMaxWarps], sh_b[kMaxWarps];
    const int tid = threadIdx.y * blockDim.x + threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5;
    warp_sum2(a, b);
    if (lane == 0) {
        sh_a[warp] = a;
        sh_b[warp] = b;
    }
    __syncthreads();
    if (warp == 0) {
        const int nwarps = (blockDim.x * blockDim.y) >> 5;
        a = lane < nwarps ? sh_a[lane] : 0.f;
        b = lane < nwarps ? sh_b[lane] : 0.f;
        warp_sum2(a, b);
    }
}

// ------------------------------------------------------------------ kernels
template <typename T, bool Contig>
__global__ void stats_kernel(
        const T* __restrict__ x, BnLayout L, int64_t N, int64_t C, int64_t S,
        float* __restrict__ mean_out, float* __restrict__ m2_out) {
    for (int64_t c = blockIdx.x; c < C; c += gridDim.x) {
        float n = 0.f, mean = 0.f, m2 = 0.f;
        for (int64_t i = threadIdx.y; i < N; i += blockDim.y)
            for (int64_t s = threadIdx.x; s < S; s += blockDim.x)
                bn_welford_add<float>(
                        n, mean, m2, BnIO<T>::load(x[elem_offset<Contig>(L, i, c, s, C, S)]));
        block_merge_moments(n, mean, m2);
        if (threadIdx.x == 0 && threadIdx.y == 0) {
            mean_out[c] = mean;
            m2_out[c] = m2;
        }
        __syncthreads();  // shared scratch is reused by the next channel
    }
}

template <typename T, bool Contig>
__global__ void backward_reduce_kernel(
        const T* __restrict__ dy, BnLayout Ldy, const T* __restrict__ x, BnLayout Lx,
        int64_t N, int64_t C, int64_t S, const float* __restrict__ mean,
        const float* __restrict__ invstd, float* __restrict__ sum_dy,
        float* __restrict__ sum_dy_xhat) {
    for (int64_t c = blockIdx.x; c < C; c += gridDim.x) {
        const float m = mean[c];
        float a = 0.f, b = 0.f;
        for (int64_t i = threadIdx.y; i < N; i += blockDim.y)
            for (int64_t s = threadIdx.x; s < S; s += blockDim.x) {
                const float g = BnIO<T>::load(dy[elem_offset<Contig>(Ldy, i, c, s, C, S)]);
                const float xv = BnIO<T>::load(x[elem_offset<Contig>(Lx, i, c, s, C, S)]);
                a += g;
                b += g * (xv - m);
            }
        block_sum2(a, b);
        if (threadIdx.x == 0 && threadIdx.y == 0) {
            sum_dy[c] = a;
            sum_dy_xhat[c] = b * invstd[c];
        }
        __syncthreads();
    }
}

template <typename T, bool Contig>
__global__ void normalize_kernel(
        const T* __restrict__ x, BnLayout L, int64_t N, int64_t C, int64_t S,
        const float* __restrict__ mean, const float* __restrict__ invstd,
        const float* __restrict__ weight, const float* __restrict__ bias, T* __restrict__ y) {
    const int64_t per_c = N * S;
    for (int64_t c = blockIdx.y; c < C; c += gridDim.y) {
        const float m = mean[c];
        const float sc = bn_norm_scale(invstd[c], weight ? weight[c] : 1.f);
        const float b = bias ? bias[c] : 0.f;
        for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < per_c;
             k += (int64_t)gridDim.x * blockDim.x) {
            const int64_t n = k / S, s = k - n * S;
            const float v = BnIO<T>::load(x[elem_offset<Contig>(L, n, c, s, C, S)]);
            y[(n * C + c) * S + s] = BnIO<T>::store(bn_normalize_elem(v, m, sc, b));
        }
    }
}

template <typename T, bool Contig>
__global__ void backward_elemt_kernel(
        const T* __restrict__ dy, BnLayout Ldy, const T* __restrict__ x, BnLayout Lx,
        int64_t N, int64_t C, int64_t S, const float* __restrict__ mean,
        const float* __restrict__ invstd, const float* __restrict__ weight,
        const float* __restrict__ sum_dy, const float* __restrict__ sum_dy_xhat,
        double inv_count, T* __restrict__ dx) {
    const int64_t per_c = N * S;
    for (int64_t c = blockIdx.y; c < C; c += gridDim.y) {
        const float m = mean[c];
        const BnElemtCoef k = bn_elemt_coef(
                invstd[c], weight ? weight[c] : 1.f, sum_dy[c], sum_dy_xhat[c], inv_count);
        for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < per_c;
             e += (int64_t)gridDim.x * blockDim.x) {
            const int64_t n = e / S, s = e - n * S;
            const float g = BnIO<T>::load(dy[elem_offset<Contig>(Ldy, n, c, s, C, S)]);
            const float xv = BnIO<T>::load(x[elem_offset<Contig>(Lx, n, c, s, C, S)]);
            dx[(n * C + c) * S + s] = BnIO<T>::store(bn_elemt_elem(g, xv, m, k));
        }
    }
}

// ------------------------------------------------------------------ host helpers
const float* channel_ptr(const Tensor* t) {
    if (t == nullptr)
        return nullptr;
    custom_assert(t->is_contiguous(), "per-channel tensors must be contiguous");
    return t->data<float>();
}

dim3 elem_grid(const Dims& d) {
    const int64_t per_c = d.N * d.S;
    int64_t gx = (per_c + kElemThreads - 1) / kElemThreads;
    const int64_t target = 4096;  // total blocks to aim for
    const int64_t cap = d.C >= target ? 1 : (target + d.C - 1) / d.C;
    gx = gx < 1 ? 1 : (gx > cap ? cap : gx);
    const int64_t gy = d.C < 65535 ? d.C : 65535;
    return dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy));
}

unsigned reduce_grid(const Dims& d) {
    return static_cast<unsigned>(d.C < 65535 ? d.C : 65535);
}

bool use_contig(const Tensor& t, bool force_strided) {
    return t.is_contiguous() && !force_strided;
}

template <typename F>
void dispatch(const Tensor& t, F&& f) {
    const auto e = t.dtype().enumv();
    if (e == DTypeEnum::float32) {
        f(float());
    } else {
        custom_assert(e == DTypeEnum::float16, "x must be float32 or float16");
        f(uint16_t());
    }
}

}  // namespace

// ------------------------------------------------------------------ entry points
void stats(const Tensor& x, Tensor& mean, Tensor& m2, bool force_strided) {
    const Dims d = dims_of(x);
    auto stream = custom::get_cuda_stream(x.device());
    if (x.size() == 0) {
        cudaMemsetAsync(mean.data(), 0, sizeof(float) * d.C, stream);
        cudaMemsetAsync(m2.data(), 0, sizeof(float) * d.C, stream);
        return;
    }
    const BnLayout L = layout_of(x);
    const bool contig = use_contig(x, force_strided);
    dispatch(x, [&](auto tag) {
        using T = decltype(tag);
        const T* px = static_cast<const T*>(x.data());
        if (contig)
            stats_kernel<T, true><<<reduce_grid(d), reduce_block(d.S), 0, stream>>>(
                    px, L, d.N, d.C, d.S, mean.data<float>(), m2.data<float>());
        else
            stats_kernel<T, false><<<reduce_grid(d), reduce_block(d.S), 0, stream>>>(
                    px, L, d.N, d.C, d.S, mean.data<float>(), m2.data<float>());
    });
    check_launch("basebn stats_kernel");
}

void normalize(
        const Tensor& x, const Tensor& mean, const Tensor& invstd, const Tensor* weight,
        const Tensor* bias, Tensor& y, bool force_strided) {
    const Dims d = dims_of(x);
    if (x.size() == 0)
        return;
    auto stream = custom::get_cuda_stream(x.device());
    const BnLayout L = layout_of(x);
    const bool contig = use_contig(x, force_strided);
    const float *pm = channel_ptr(&mean), *pi = channel_ptr(&invstd);
    const float *pw = channel_ptr(weight), *pb = channel_ptr(bias);
    dispatch(x, [&](auto tag) {
        using T = decltype(tag);
        const T* px = static_cast<const T*>(x.data());
        T* py = static_cast<T*>(y.data());
        if (contig)
            normalize_kernel<T, true><<<elem_grid(d), kElemThreads, 0, stream>>>(
                    px, L, d.N, d.C, d.S, pm, pi, pw, pb, py);
        else
            normalize_kernel<T, false><<<elem_grid(d), kElemThreads, 0, stream>>>(
                    px, L, d.N, d.C, d.S, pm, pi, pw, pb, py);
    });
    check_launch("basebn normalize_kernel");
}

void backward_reduce(
        const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& invstd,
        Tensor& sum_dy, Tensor& sum_dy_xhat, bool force_strided) {
    const Dims d = dims_of(x);
    auto stream = custom::get_cuda_stream(x.device());
    if (x.size() == 0) {
        cudaMemsetAsync(sum_dy.data(), 0, sizeof(float) * d.C, stream);
        cudaMemsetAsync(sum_dy_xhat.data(), 0, sizeof(float) * d.C, stream);
        return;
    }
    custom_assert(dy.dtype().enumv() == x.dtype().enumv(), "dy and x dtypes differ");
    const BnLayout Lg = layout_of(dy), Lx = layout_of(x);
    const bool contig = use_contig(dy, force_strided) && use_contig(x, force_strided);
    const float *pm = channel_ptr(&mean), *pi = channel_ptr(&invstd);
    dispatch(x, [&](auto tag) {
        using T = decltype(tag);
        const T* pg = static_cast<const T*>(dy.data());
        const T* px = static_cast<const T*>(x.data());
        if (contig)
            backward_reduce_kernel<T, true><<<reduce_grid(d), reduce_block(d.S), 0, stream>>>(
                    pg, Lg, px, Lx, d.N, d.C, d.S, pm, pi, sum_dy.data<float>(),
                    sum_dy_xhat.data<float>());
        else
            backward_reduce_kernel<T, false><<<reduce_grid(d), reduce_block(d.S), 0, stream>>>(
                    pg, Lg, px, Lx, d.N, d.C, d.S, pm, pi, sum_dy.data<float>(),
                    sum_dy_xhat.data<float>());
    });
    check_launch("basebn backward_reduce_kernel");
}

void backward_elemt(
        const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& invstd,
        const Tensor* weight, const Tensor& sum_dy, const Tensor& sum_dy_xhat, double count,
        Tensor& dx, bool force_strided) {
    const Dims d = dims_of(x);
    if (x.size() == 0)
        return;
    custom_assert(dy.dtype().enumv() == x.dtype().enumv(), "dy and x dtypes differ");
    auto stream = custom::get_cuda_stream(x.device());
    const BnLayout Lg = layout_of(dy), Lx = layout_of(x);
    const bool contig = use_contig(dy, force_strided) && use_contig(x, force_strided);
    const float *pm = channel_ptr(&mean), *pi = channel_ptr(&invstd), *pw = channel_ptr(weight);
    const float *p1 = channel_ptr(&sum_dy), *p2 = channel_ptr(&sum_dy_xhat);
    const double inv_count = count > 0.0 ? 1.0 / count : 0.0;
    dispatch(x, [&](auto tag) {
        using T = decltype(tag);
        const T* pg = static_cast<const T*>(dy.data());
        const T* px = static_cast<const T*>(x.data());
        T* po = static_cast<T*>(dx.data());
        if (contig)
            backward_elemt_kernel<T, true><<<elem_grid(d), kElemThreads, 0, stream>>>(
                    pg, Lg, px, Lx, d.N, d.C, d.S, pm, pi, pw, p1, p2, inv_count, po);
        else
            backward_elemt_kernel<T, false><<<elem_grid(d), kElemThreads, 0, stream>>>(
                    pg, Lg, px, Lx, d.N, d.C, d.S, pm, pi, pw, p1, p2, inv_count, po);
    });
    check_launch("basebn backward_elemt_kernel");
}

}  // namespace cuda
}  // namespace basebn
