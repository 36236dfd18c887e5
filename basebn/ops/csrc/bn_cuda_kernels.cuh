// The CUDA BatchNorm kernels (device code only; no MegEngine, no host API). Launched by bn_cuda_launch.cu.
//
// Two families of kernels:
//
// 1. The row path (contiguous input, N * S <= 2^30 per channel): the kernels named *_rows_kernel.
//    A contiguous (N, C, S) tensor is N * C rows of S contiguous elements; channel c is the rows n * C + c.
//    Elements are read as vectors of V elements (V = 4: float4 / 4 halves in 8 bytes, when S % 4 == 0 and
//    every pointer is 4-element aligned; else V = 1), and a channel is addressed as nvec = N * S / V vectors:
//    vector v of channel c is row n = v / (S / V), at offset n * (C * S / V) + c * (S / V) + (v - n * S / V),
//    in vectors. v and n are 32-bit; the division is a multiply-high by a precomputed magic number (FastDiv,
//    exact for v < 2^31); the offset is 64-bit (the whole tensor may exceed 2^31 elements).
//    Each thread loads U vectors (v, v + B, ..., v + (U - 1) * B for a block of B threads) before using any
//    (U * V values in flight per tensor), then processes them; a reduction's last step, with fewer than U
//    vectors left, is one more such step whose missing vectors are counted as nothing (no serial tail).
//    - Reductions (stats, backward reduce): grid (split, C); block j of channel c takes a contiguous chunk of
//      the channel's vectors (bn_cuda_launch.cu picks the block size and split: one block per channel
//      (split = 1) when C already fills the GPU's resident blocks, else up to that many blocks per channel).
//      The moments: each group of (up to 16) values a thread loads is reduced to its own (count, mean, M2)
//      (mean of the group, sum of squared deviations from that mean) and Chan-merged into the thread's
//      running moments (bn_chan_merge: one division per group instead of Welford's one per value);
//      the block then Chan-merges threads with warp shuffles and shared memory. The backward sums: float32
//      per-group sums added to the thread's sums, then a tree over the block. split == 1 writes the channel's
//      result; split > 1 writes a partial per block into a workspace (allocated by the launcher, stream-
//      ordered) and a merge kernel (one warp per channel) combines the partials of a channel in a FIXED order
//      (lane l takes partials l, l + 32, ... in order, then a shuffle tree): deterministic, no atomics.
//    - Element-wise (normalize, backward elemt): grid (blocks per channel, C), per-channel coefficients in
//      registers, each thread U vectors per step, grid-stride over the channel's vectors.
// 2. The strided path (non-contiguous input, force_strided, or a channel of more than 2^30 elements):
//    the original kernels, launched with Contig = false only: each element addressed with bn_offset() on the
//    real strides (correct for any layout, contiguous included).
//    Reductions: one thread block per channel, threads (x over the spatial axis, y over N), per-thread
//    Welford, block merge. Element-wise: grid.y walks channels, grid.x / threads the N * S elements.
// Outputs are always written contiguous (N, C, S). Channel loops (c += gridDim.y) let C exceed 65535.
// The plain BN passes are the fused kernels with the identity activation (no shortcut): one kernel each.
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

// ================================================================== the row path (contiguous input)
constexpr int kMergeThreads = 256;  // merge kernels: one warp per channel

// n / d for n < 2^31 and 1 <= d < 2^31 (Granlund-Montgomery, rounded-up multiplier): for d >= 2, l = ceil(log2 d),
// mul = ceil(2^(31 + l) / d) (< 2^32), q = umulhi(n, mul) >> (l - 1). Built on the host (bn_cuda_launch.cu).
struct FastDiv {
    uint32_t d, mul, shift;
    __device__ __forceinline__ uint32_t div(uint32_t n) const {
        return d == 1 ? n : (__umulhi(n, mul) >> shift);
    }
};

// a contiguous (N, C, S) tensor seen as vectors of V elements (S % V == 0)
struct Rows {
    int64_t C;
    int64_t CSv;     // C * S / V: vectors from row (n, c) to row (n + 1, c)
    uint32_t Sv;     // S / V: vectors per row
    uint32_t nvec;   // N * S / V: vectors per channel (<= 2^30)
    FastDiv div_sv;  // division by Sv
};

// offset (in vectors) of vector v (< nvec) of the channel whose first row starts at cbase = c * Sv
__device__ __forceinline__ int64_t row_vec_offset(const Rows& R, int64_t cbase, uint32_t v) {
    const uint32_t n = R.div_sv.div(v);
    return (int64_t)n * R.CSv + cbase + (int64_t)(v - n * R.Sv);
}

template <typename T, int V>
struct alignas(sizeof(T) * V) VecT {
    T v[V];
};

template <typename T, int V>
__device__ __forceinline__ void load_vec(const T* __restrict__ p, int64_t off, float* out) {
    const VecT<T, V> q = reinterpret_cast<const VecT<T, V>*>(p)[off];
#pragma unroll
    for (int i = 0; i < V; ++i)
        out[i] = BnIO<T>::load(q.v[i]);
}

template <typename T, int V>
__device__ __forceinline__ void store_vec(T* __restrict__ p, int64_t off, const float* in) {
    VecT<T, V> q;
#pragma unroll
    for (int i = 0; i < V; ++i)
        q.v[i] = BnIO<T>::store(in[i]);
    reinterpret_cast<VecT<T, V>*>(p)[off] = q;
}

// sum of G values (G a power of two), pairwise
template <int G>
__device__ __forceinline__ float tree_sum(const float* v) {
    float t[G];
#pragma unroll
    for (int i = 0; i < G; ++i)
        t[i] = v[i];
#pragma unroll
    for (int w = G / 2; w >= 1; w >>= 1)
#pragma unroll
        for (int i = 0; i < w; ++i)
            t[i] += t[i + w];
    return t[0];
}

// Chan-merge G values into the running moments: the group's own mean (its sum * 1 / G, exact scaling for a
// power of two G) and M2 about that mean, then one merge with count G.
template <int G>
__device__ __forceinline__ void moments_add_group(float& n, float& mean, float& m2, const float* v) {
    const float mb = tree_sum<G>(v) * (1.f / G);
    float q = 0.f;
#pragma unroll
    for (int i = 0; i < G; ++i) {
        const float d = v[i] - mb;
        q = fmaf(d, d, q);
    }
    bn_chan_merge<float>(n, mean, m2, (float)G, mb, q);
}

// As moments_add_group for the first cnt (1 <= cnt <= M) of M values; the others are zeros (they leave the sum
// unchanged) and are left out of M2 and the count.
template <int M>
__device__ __forceinline__ void moments_add_partial(float& n, float& mean, float& m2, const float* v, int cnt) {
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < M; ++i)
        s += v[i];
    const float fc = (float)cnt;
    const float mb = s / fc;
    float q = 0.f;
#pragma unroll
    for (int i = 0; i < M; ++i) {
        const float d = v[i] - mb;
        q = i < cnt ? fmaf(d, d, q) : q;
    }
    bn_chan_merge<float>(n, mean, m2, fc, mb, q);
}

// Moments of channel c's vectors [blockIdx.x * chunk, min((blockIdx.x + 1) * chunk, nvec)), c = blockIdx.y +
// k * gridDim.y. Writes (count,) mean, M2 at [c * gridDim.x + blockIdx.x]: the channel's result when gridDim.x
// == 1 (out_n may be NULL then), else the block's partial (stats_merge_kernel). 1D blocks, a multiple of 32.
template <typename T, int V, int U>
__global__ void __launch_bounds__(kReduceThreads, 2) stats_rows_kernel(
        const T* __restrict__ x, Rows R, uint32_t chunk, float* __restrict__ out_n,
        float* __restrict__ out_mean, float* __restrict__ out_m2) {
    const uint32_t B = blockDim.x;
    const uint32_t begin = blockIdx.x * chunk;
    const uint32_t end = begin + chunk < R.nvec ? begin + chunk : R.nvec;
    for (int64_t c = blockIdx.y; c < R.C; c += gridDim.y) {
        const int64_t cbase = c * R.Sv;
        float n = 0.f, mean = 0.f, m2 = 0.f;
        // steps of U vectors per thread (v, v + B, ..., v + (U - 1) * B), all loaded before any is used; then at
        // most one step with fewer than U left (still U loads at once: no serial tail)
        uint32_t v = begin + threadIdx.x;
        for (; v + (U - 1) * B < end; v += U * B) {
            float vals[U * V];
#pragma unroll
            for (int u = 0; u < U; ++u)
                load_vec<T, V>(x, row_vec_offset(R, cbase, v + u * B), vals + u * V);
            constexpr int G = U * V < 16 ? U * V : 16;  // (larger groups are not kept in registers)
#pragma unroll
            for (int g = 0; g < U * V; g += G)
                moments_add_group<G>(n, mean, m2, vals + g);
        }
        if (v < end) {  // vectors v + u * B < end for u < k (k >= 1); the others load vector v again, then read as 0
            float vals[U * V];
            int k = 0;
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const bool ok = v + u * B < end;
                k += ok ? 1 : 0;
                load_vec<T, V>(x, row_vec_offset(R, cbase, ok ? v + u * B : v), vals + u * V);
#pragma unroll
                for (int i = 0; i < V; ++i)
                    vals[u * V + i] = ok ? vals[u * V + i] : 0.f;
            }
            moments_add_partial<U * V>(n, mean, m2, vals, k * V);
        }
        block_merge_moments(n, mean, m2);
        if (threadIdx.x == 0) {
            const int64_t o = c * gridDim.x + blockIdx.x;
            if (out_n != nullptr)
                out_n[o] = n;
            out_mean[o] = mean;
            out_m2[o] = m2;
        }
        __syncthreads();  // shared scratch is reused by the next channel
    }
}

// The channel's moments from its `split` partials (count, mean, M2 at [c * split + j]), merged in a fixed order.
__global__ void __launch_bounds__(kMergeThreads) stats_merge_kernel(
        const float* __restrict__ pn, const float* __restrict__ pmean, const float* __restrict__ pm2, int64_t C,
        int split, float* __restrict__ mean_out, float* __restrict__ m2_out) {
    const int lane = threadIdx.x & 31;
    const int64_t warps = blockDim.x >> 5;
    for (int64_t c = blockIdx.x * warps + (threadIdx.x >> 5); c < C; c += gridDim.x * warps) {  // warp-uniform
        float n = 0.f, mean = 0.f, m2 = 0.f;
        for (int j = lane; j < split; j += 32) {
            const int64_t o = c * split + j;
            bn_chan_merge<float>(n, mean, m2, pn[o], pmean[o], pm2[o]);
        }
        warp_merge_moments(n, mean, m2);
        if (lane == 0) {
            mean_out[c] = mean;
            m2_out[c] = m2;
        }
    }
}

// dz at one element: dy * act'(pre) (act_grad_at of the strided path, on loaded values)
template <int Act>
__device__ __forceinline__ float act_grad_val(float g, float yv, float xv, float m, float sc, float b) {
    if (Act == kBnActIdentity)
        return g;
    if (bn_act_from_pre(Act))
        return bn_act_grad<Act>(g, bn_normalize_elem(xv, m, sc, b));
    return bn_act_grad<Act>(g, yv);
}

// y is read for ReLU / ReLU6 only
template <int Act>
struct ActReadsY {
    static constexpr bool value = Act != kBnActIdentity && !bn_act_from_pre(Act);
};

// sum(dz), sum(dz * (x - mean)) over channel c's vectors of this block (as stats_rows_kernel). gridDim.x == 1:
// the channel's result, sum_dz_xhat scaled by invstd (out_b = sum_dz_xhat); else partials, unscaled.
template <typename T, int V, int U, int Act>
__global__ void __launch_bounds__(kReduceThreads, 2) act_backward_reduce_rows_kernel(
        const T* __restrict__ dy, const T* __restrict__ y, const T* __restrict__ x, Rows R, uint32_t chunk,
        const float* __restrict__ mean, const float* __restrict__ invstd, const float* __restrict__ weight,
        const float* __restrict__ bias, float* __restrict__ out_a, float* __restrict__ out_b) {
    constexpr bool kY = ActReadsY<Act>::value;
    const uint32_t B = blockDim.x;
    const uint32_t begin = blockIdx.x * chunk;
    const uint32_t end = begin + chunk < R.nvec ? begin + chunk : R.nvec;
    for (int64_t c = blockIdx.y; c < R.C; c += gridDim.y) {
        const int64_t cbase = c * R.Sv;
        const float m = mean[c];
        const float sc = bn_norm_scale(invstd[c], weight ? weight[c] : 1.f);
        const float bc = bias ? bias[c] : 0.f;
        float a = 0.f, b = 0.f;
        // steps of U vectors per thread, all loaded before any is used; then at most one step with fewer left
        uint32_t v = begin + threadIdx.x;
        for (; v + (U - 1) * B < end; v += U * B) {
            float gv[U * V], xv[U * V], yv[kY ? U * V : 1];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int64_t off = row_vec_offset(R, cbase, v + u * B);
                load_vec<T, V>(dy, off, gv + u * V);
                load_vec<T, V>(x, off, xv + u * V);
                if (kY)
                    load_vec<T, V>(y, off, yv + (kY ? u * V : 0));
            }
            float da[U * V], db[U * V];
#pragma unroll
            for (int i = 0; i < U * V; ++i) {
                const float g = act_grad_val<Act>(gv[i], kY ? yv[kY ? i : 0] : 0.f, xv[i], m, sc, bc);
                da[i] = g;
                db[i] = g * (xv[i] - m);
            }
            a += tree_sum<U * V>(da);
            b += tree_sum<U * V>(db);
        }
        if (v < end) {  // vectors v + u * B >= end load vector v again and count as 0
            float gv[U * V], xv[U * V], yv[kY ? U * V : 1];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int64_t off = row_vec_offset(R, cbase, v + u * B < end ? v + u * B : v);
                load_vec<T, V>(dy, off, gv + u * V);
                load_vec<T, V>(x, off, xv + u * V);
                if (kY)
                    load_vec<T, V>(y, off, yv + (kY ? u * V : 0));
            }
            float da[U * V], db[U * V];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const bool ok = v + u * B < end;
#pragma unroll
                for (int i = u * V; i < (u + 1) * V; ++i) {
                    const float g = act_grad_val<Act>(gv[i], kY ? yv[kY ? i : 0] : 0.f, xv[i], m, sc, bc);
                    da[i] = ok ? g : 0.f;
                    db[i] = ok ? g * (xv[i] - m) : 0.f;
                }
            }
            a += tree_sum<U * V>(da);
            b += tree_sum<U * V>(db);
        }
        block_sum2(a, b);
        if (threadIdx.x == 0) {
            const int64_t o = c * gridDim.x + blockIdx.x;
            out_a[o] = a;
            out_b[o] = gridDim.x == 1 ? b * invstd[c] : b;
        }
        __syncthreads();
    }
}

// The channel's sums from its `split` partials (at [c * split + j]), added in a fixed order; sum_dz_xhat scaled
// by invstd.
__global__ void __launch_bounds__(kMergeThreads) sum2_merge_kernel(
        const float* __restrict__ pa, const float* __restrict__ pb, int64_t C, int split,
        const float* __restrict__ invstd, float* __restrict__ sum_dz, float* __restrict__ sum_dz_xhat) {
    const int lane = threadIdx.x & 31;
    const int64_t warps = blockDim.x >> 5;
    for (int64_t c = blockIdx.x * warps + (threadIdx.x >> 5); c < C; c += gridDim.x * warps) {  // warp-uniform
        float a = 0.f, b = 0.f;
        for (int j = lane; j < split; j += 32) {
            a += pa[c * split + j];
            b += pb[c * split + j];
        }
        warp_sum2(a, b);
        if (lane == 0) {
            sum_dz[c] = a;
            sum_dz_xhat[c] = b * invstd[c];
        }
    }
}

// y = act(bn(x) [+ shortcut]) over channel c's vectors; grid (blocks per channel, channels), grid-stride.
template <typename T, int V, int U, int Act, bool Add>
__global__ void __launch_bounds__(kElemThreads) act_normalize_rows_kernel(
        const T* __restrict__ x, const T* __restrict__ sc, Rows R, const float* __restrict__ mean,
        const float* __restrict__ invstd, const float* __restrict__ weight, const float* __restrict__ bias,
        T* __restrict__ y) {
    const uint32_t B = blockDim.x;
    const uint32_t step = gridDim.x * B * U;
    for (int64_t c = blockIdx.y; c < R.C; c += gridDim.y) {
        const int64_t cbase = c * R.Sv;
        const float m = mean[c];
        const float scale = bn_norm_scale(invstd[c], weight ? weight[c] : 1.f);
        const float b = bias ? bias[c] : 0.f;
        for (uint32_t v0 = blockIdx.x * B * U + threadIdx.x; v0 < R.nvec; v0 += step) {
            float xv[U][V], sv[Add ? U : 1][V];
            int64_t off[U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                off[u] = 0;
                if (v0 + u * B < R.nvec) {
                    off[u] = row_vec_offset(R, cbase, v0 + u * B);
                    load_vec<T, V>(x, off[u], xv[u]);
                    if (Add)
                        load_vec<T, V>(sc, off[u], sv[Add ? u : 0]);
                }
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                if (v0 + u * B < R.nvec) {
                    float o[V];
#pragma unroll
                    for (int i = 0; i < V; ++i) {
                        float t = bn_normalize_elem(xv[u][i], m, scale, b);
                        if (Add)
                            t += sv[Add ? u : 0][i];
                        o[i] = bn_act_apply<Act>(t);
                    }
                    store_vec<T, V>(y, off[u], o);
                }
            }
        }
    }
}

// dx (and dshortcut = dz when Short) over channel c's vectors; grid as act_normalize_rows_kernel.
template <typename T, int V, int U, int Act, bool Short>
__global__ void __launch_bounds__(kElemThreads) act_backward_elemt_rows_kernel(
        const T* __restrict__ dy, const T* __restrict__ y, const T* __restrict__ x, Rows R,
        const float* __restrict__ mean, const float* __restrict__ invstd, const float* __restrict__ weight,
        const float* __restrict__ bias, const float* __restrict__ sum_dz, const float* __restrict__ sum_dz_xhat,
        double inv_count, T* __restrict__ dx, T* __restrict__ ds) {
    constexpr bool kY = ActReadsY<Act>::value;
    const uint32_t B = blockDim.x;
    const uint32_t step = gridDim.x * B * U;
    for (int64_t c = blockIdx.y; c < R.C; c += gridDim.y) {
        const int64_t cbase = c * R.Sv;
        const float m = mean[c];
        const float w = weight ? weight[c] : 1.f;
        const float sc = bn_norm_scale(invstd[c], w);
        const float bc = bias ? bias[c] : 0.f;
        const BnElemtCoef k = bn_elemt_coef(invstd[c], w, sum_dz[c], sum_dz_xhat[c], inv_count);
        for (uint32_t v0 = blockIdx.x * B * U + threadIdx.x; v0 < R.nvec; v0 += step) {
            float gv[U][V], xv[U][V], yv[kY ? U : 1][V];
            int64_t off[U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                off[u] = 0;
                if (v0 + u * B < R.nvec) {
                    off[u] = row_vec_offset(R, cbase, v0 + u * B);
                    load_vec<T, V>(dy, off[u], gv[u]);
                    load_vec<T, V>(x, off[u], xv[u]);
                    if (kY)
                        load_vec<T, V>(y, off[u], yv[kY ? u : 0]);
                }
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                if (v0 + u * B < R.nvec) {
                    float o[V], g[V];
#pragma unroll
                    for (int i = 0; i < V; ++i) {
                        g[i] = act_grad_val<Act>(gv[u][i], kY ? yv[kY ? u : 0][i] : 0.f, xv[u][i], m, sc, bc);
                        o[i] = bn_elemt_elem(g[i], xv[u][i], m, k);
                    }
                    store_vec<T, V>(dx, off[u], o);
                    if (Short)
                        store_vec<T, V>(ds, off[u], g);
                }
            }
        }
    }
}

}  // namespace kern
}  // namespace cuda
}  // namespace basebn
