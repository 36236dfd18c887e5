// The CUDA BatchNorm kernels (device code only; no MegEngine, no host API). Launched by bn_cuda_launch.cu.
//
// One design for both reductions (stats, backward reduce): one thread block per channel,
// threads laid out (x over the contiguous spatial axis, y over N); every thread accumulates its
// strided share (Welford for the moments, float sums for the gradients), then the block merges
// with warp shuffles and shared memory (Chan's formula for the moments).
// Element-wise kernels (normalize, backward elemt): grid.y walks channels, grid.x/threads walk
// the N*S elements of a channel; per-channel coefficients are computed once per thread.
// The plain BN passes are the fused kernels with the identity activation (no shortcut): one kernel each.
// Non-contiguous inputs (Contig = false) address elements with bn_offset() on the real strides;
// outputs are always written contiguous (N, C, S).
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include "bn_math.h"

namespace basebn {
namespace cuda {
namespace kern {

constexpr int kReduceThreads = 512;  // reduction blocks: blockDim.x * blockDim.y
constexpr int kElemThreads = 256;    // element-wise blocks
constexpr int kMaxWarps = kReduceThreads / 32;
constexpr unsigned kFullMask = 0xffffffffu;

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
__device__ inline void block_merge_moments(float& n, float& mean, float& m2) {
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

__device__ inline void block_sum2(float& a, float& b) {
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

// ------------------------------------------------------------------ fused BN -> activation (bn_math.h)
// As normalize / backward_reduce / backward_elemt, with y = act(pre), pre = bn(x) [+ shortcut], and
// dz = act'(pre) * dy. act' is read from y for ReLU / ReLU6; for SiLU / HSwish it is taken at pre recomputed
// from x (value xv) and the channel's mean m, scale sc = invstd * weight and bias b (bn_act_from_pre), and y
// is not read (nor for the identity: it may be NULL then). shortcut only when Add, dshortcut only when Short.
template <typename T, bool Contig, int Act>
__device__ __forceinline__ float act_grad_at(
        const T* __restrict__ dy, const BnLayout& Ldy, const T* __restrict__ y, const BnLayout& Ly, float xv,
        float m, float sc, float b, int64_t n, int64_t c, int64_t s, int64_t C, int64_t S) {
    const float g = BnIO<T>::load(dy[elem_offset<Contig>(Ldy, n, c, s, C, S)]);
    if (Act == kBnActIdentity)
        return g;
    if (bn_act_from_pre(Act))
        return bn_act_grad<Act>(g, bn_normalize_elem(xv, m, sc, b));
    return bn_act_grad<Act>(g, BnIO<T>::load(y[elem_offset<Contig>(Ly, n, c, s, C, S)]));
}

template <typename T, bool Contig, int Act, bool Add>
__global__ void act_normalize_kernel(
        const T* __restrict__ x, BnLayout L, const T* __restrict__ sc, BnLayout Ls, int64_t N, int64_t C,
        int64_t S, const float* __restrict__ mean, const float* __restrict__ invstd,
        const float* __restrict__ weight, const float* __restrict__ bias, T* __restrict__ y) {
    const int64_t per_c = N * S;
    for (int64_t c = blockIdx.y; c < C; c += gridDim.y) {
        const float m = mean[c];
        const float scale = bn_norm_scale(invstd[c], weight ? weight[c] : 1.f);
        const float b = bias ? bias[c] : 0.f;
        for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < per_c;
             k += (int64_t)gridDim.x * blockDim.x) {
            const int64_t n = k / S, s = k - n * S;
            float v = bn_normalize_elem(BnIO<T>::load(x[elem_offset<Contig>(L, n, c, s, C, S)]), m, scale, b);
            if (Add)
                v += BnIO<T>::load(sc[elem_offset<Contig>(Ls, n, c, s, C, S)]);
            y[(n * C + c) * S + s] = BnIO<T>::store(bn_act_apply<Act>(v));
        }
    }
}

template <typename T, bool Contig, int Act>
__global__ void act_backward_reduce_kernel(
        const T* __restrict__ dy, BnLayout Ldy, const T* __restrict__ y, BnLayout Ly, const T* __restrict__ x,
        BnLayout Lx, int64_t N, int64_t C, int64_t S, const float* __restrict__ mean,
        const float* __restrict__ invstd, const float* __restrict__ weight, const float* __restrict__ bias,
        float* __restrict__ sum_dz, float* __restrict__ sum_dz_xhat) {
    for (int64_t c = blockIdx.x; c < C; c += gridDim.x) {
        const float m = mean[c];
        const float sc = bn_norm_scale(invstd[c], weight ? weight[c] : 1.f);
        const float bc = bias ? bias[c] : 0.f;
        float a = 0.f, b = 0.f;
        for (int64_t i = threadIdx.y; i < N; i += blockDim.y)
            for (int64_t s = threadIdx.x; s < S; s += blockDim.x) {
                const float xv = BnIO<T>::load(x[elem_offset<Contig>(Lx, i, c, s, C, S)]);
                const float g = act_grad_at<T, Contig, Act>(dy, Ldy, y, Ly, xv, m, sc, bc, i, c, s, C, S);
                a += g;
                b += g * (xv - m);
            }
        block_sum2(a, b);
        if (threadIdx.x == 0 && threadIdx.y == 0) {
            sum_dz[c] = a;
            sum_dz_xhat[c] = b * invstd[c];
        }
        __syncthreads();
    }
}

template <typename T, bool Contig, int Act, bool Short>
__global__ void act_backward_elemt_kernel(
        const T* __restrict__ dy, BnLayout Ldy, const T* __restrict__ y, BnLayout Ly, const T* __restrict__ x,
        BnLayout Lx, int64_t N, int64_t C, int64_t S, const float* __restrict__ mean,
        const float* __restrict__ invstd, const float* __restrict__ weight, const float* __restrict__ bias,
        const float* __restrict__ sum_dz, const float* __restrict__ sum_dz_xhat, double inv_count,
        T* __restrict__ dx, T* __restrict__ ds) {
    const int64_t per_c = N * S;
    for (int64_t c = blockIdx.y; c < C; c += gridDim.y) {
        const float m = mean[c];
        const float w = weight ? weight[c] : 1.f;
        const float sc = bn_norm_scale(invstd[c], w);
        const float bc = bias ? bias[c] : 0.f;
        const BnElemtCoef k = bn_elemt_coef(invstd[c], w, sum_dz[c], sum_dz_xhat[c], inv_count);
        for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < per_c;
             e += (int64_t)gridDim.x * blockDim.x) {
            const int64_t n = e / S, s = e - n * S, o = (n * C + c) * S + s;
            const float xv = BnIO<T>::load(x[elem_offset<Contig>(Lx, n, c, s, C, S)]);
            const float g = act_grad_at<T, Contig, Act>(dy, Ldy, y, Ly, xv, m, sc, bc, n, c, s, C, S);
            dx[o] = BnIO<T>::store(bn_elemt_elem(g, xv, m, k));
            if (Short)
                ds[o] = BnIO<T>::store(g);
        }
    }
}

}  // namespace kern
}  // namespace cuda
}  // namespace basebn
