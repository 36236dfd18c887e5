// Launchers of the CUDA BatchNorm kernels (bn_cuda_kernels.cuh) behind the C API of bn_cuda_launch.h:
// raw pointers, sizes, strides and a stream. No MegEngine header: builds alone with nvcc
// (nvcc -shared -Xcompiler -fPIC bn_cuda_launch.cu; see benchmarks/cuda/run_harness.py).
// Each call picks the row path (contiguous tensors, vectors of 4 elements where S and the pointers allow) or the
// strided path (bn_cuda_kernels.cuh's header); the reductions of the row path split a channel over several
// blocks when C alone does not fill the GPU, with a stream-ordered workspace (cudaMallocAsync / cudaFreeAsync
// on the call's stream: also valid while a CUDA graph is captured) for the per-block partials.
#include "bn_cuda_launch.h"

#include <atomic>
#include <initializer_list>
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

// ------------------------------------------------------------------ the row path (contiguous input)
using kern::FastDiv;
using kern::kMergeThreads;
using kern::Rows;

constexpr int64_t kMaxRowsChannel = int64_t(1) << 30;  // the row path: at most this many elements per channel
constexpr int kResidentThreads = 1024;  // reduction threads per SM guaranteed by __launch_bounds__(512, 2)

// The SM count of the current device, queried once per device.
int sm_count() {
    constexpr int kMaxDevices = 64;
    static std::atomic<int> cache[kMaxDevices];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0)
        dev = 0;
    if (dev < kMaxDevices) {
        const int known = cache[dev].load(std::memory_order_relaxed);
        if (known > 0)
            return known;
    }
    int n = 0;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0)
        n = 1;  // (a launch on a broken device reports the error itself)
    if (dev < kMaxDevices)
        cache[dev].store(n, std::memory_order_relaxed);
    return n;
}

FastDiv make_fastdiv(uint32_t d) {  // 1 <= d < 2^31 (kern::FastDiv)
    FastDiv f{d, 0u, 0u};
    if (d > 1) {
        uint32_t l = 0;
        while ((uint64_t(1) << l) < d)
            ++l;  // l = ceil(log2 d) >= 1
        f.mul = static_cast<uint32_t>(((uint64_t(1) << (31 + l)) + d - 1) / d);
        f.shift = l - 1;
    }
    return f;
}

bool aligned(const void* p, size_t bytes) {
    return p == nullptr || reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// The row path's vector width for a call: 4 when S % 4 == 0 and every pointer is aligned to 4 elements, else 1;
// 0 for the strided path (not `contig`, or a channel too large for its 32-bit vector indices).
int rows_vec(bool contig, const Dims3& d, size_t elem_size, std::initializer_list<const void*> ptrs) {
    if (!contig || d.N * d.S > kMaxRowsChannel)
        return 0;
    if (d.S % 4 != 0)
        return 1;
    for (const void* p : ptrs)
        if (!aligned(p, 4 * elem_size))
            return 1;
    return 4;
}

Rows make_rows(const Dims3& d, int V) {
    Rows R;
    R.C = d.C;
    R.CSv = d.C * (d.S / V);
    R.Sv = static_cast<uint32_t>(d.S / V);
    R.nvec = static_cast<uint32_t>(d.N * d.S / V);
    R.div_sv = make_fastdiv(R.Sv);
    return R;
}

unsigned channel_grid(int64_t C) {  // grid.y: channels (kernels loop over the rest)
    return static_cast<unsigned>(C < 65535 ? C : 65535);
}

// A row-path reduction's launch: `threads` per block, `split` blocks per channel, `chunk` vectors per block.
struct ReducePlan {
    unsigned threads, split;
    uint32_t chunk;
};

// U = vectors a thread loads per step ("item"). Blocks of 512 threads, 256 or 128 for small channels (at least two
// items per thread where a 128-thread block allows). One block per channel when the C blocks fill the GPU's
// resident slots (kResidentThreads per SM); else floor(slots / C) blocks per channel, at most one per `threads`
// items (no block with less than an item per thread). Chunks are whole multiples of `threads` vectors.
ReducePlan reduce_plan(int64_t C, uint32_t nvec, int U) {
    const uint32_t items = (nvec + U - 1) / U;
    unsigned B = kReduceThreads;
    while (B > 128 && items < 2u * B)
        B >>= 1;
    const int64_t slots = static_cast<int64_t>(sm_count()) * (kResidentThreads / B);
    int64_t split = 1;
    if (C < slots) {
        split = slots / C;
        const int64_t by_work = (items + B - 1) / B;
        split = split < by_work ? split : by_work;
    }
    if (split <= 1)
        return ReducePlan{B, 1u, nvec};
    int64_t chunk = (nvec + split - 1) / split;
    chunk = (chunk + B - 1) / B * B;
    split = (nvec + chunk - 1) / chunk;  // every block non-empty
    return ReducePlan{B, static_cast<unsigned>(split), static_cast<uint32_t>(chunk)};
}

// element-wise row kernels: blocks per channel (grid.x). One per kElemThreads * U vectors up to about 32 blocks
// per SM in all; beyond that fewer, each taking the same number of grid-stride rounds.
unsigned elem_rows_blocks(int64_t C, uint32_t nvec, int U) {
    const int64_t per_block = static_cast<int64_t>(kElemThreads) * U;
    const int64_t need = (nvec + per_block - 1) / per_block;
    const int64_t target = static_cast<int64_t>(sm_count()) * 32;
    int64_t cap = (target + C - 1) / C;
    cap = cap < 1 ? 1 : cap;
    const int64_t rounds = (need + cap - 1) / cap;
    return static_cast<unsigned>((need + rounds - 1) / rounds);
}

unsigned merge_grid(int64_t C) {
    const int64_t warps = kMergeThreads / 32;
    const int64_t g = (C + warps - 1) / warps;
    return static_cast<unsigned>(g < 65535 ? g : 65535);
}

// stream-ordered workspace of `floats` floats; the caller frees it with cudaFreeAsync on the same stream after the
// kernels that read it
cudaError_t workspace(float** p, size_t floats, cudaStream_t stream) {
    return cudaMallocAsync(reinterpret_cast<void**>(p), floats * sizeof(float), stream);
}

// unroll (vectors per thread per step): 64 bytes per tensor for float32 vectors, 32 for float16 ones (64 for
// stats), 8 scalars; element-wise: 4
template <typename T, int V>
struct StatsUnroll {
    static constexpr int value = V == 1 ? 8 : (sizeof(T) == 2 ? 8 : 4);
};
template <int V>
struct ReduceUnroll {
    static constexpr int value = V == 1 ? 8 : 4;
};
constexpr int kElemUnroll = 4;

template <typename T, int V>
cudaError_t stats_rows(const T* x, const Dims3& d, float* mean, float* m2, cudaStream_t stream) {
    constexpr int U = StatsUnroll<T, V>::value;
    const Rows R = make_rows(d, V);
    const ReducePlan P = reduce_plan(d.C, R.nvec, U);
    const unsigned gy = channel_grid(d.C);
    if (P.split == 1) {
        kern::stats_rows_kernel<T, V, U><<<dim3(1, gy), P.threads, 0, stream>>>(x, R, P.chunk, nullptr, mean, m2);
        return cudaGetLastError();
    }
    const size_t parts = static_cast<size_t>(d.C) * P.split;
    float* ws = nullptr;
    cudaError_t err = workspace(&ws, 3 * parts, stream);
    if (err != cudaSuccess) {  // no stream-ordered memory here (an old driver): one block per channel
        (void)cudaGetLastError();
        kern::stats_rows_kernel<T, V, U><<<dim3(1, gy), P.threads, 0, stream>>>(x, R, R.nvec, nullptr, mean, m2);
        return cudaGetLastError();
    }
    kern::stats_rows_kernel<T, V, U><<<dim3(P.split, gy), P.threads, 0, stream>>>(
            x, R, P.chunk, ws, ws + parts, ws + 2 * parts);
    err = cudaGetLastError();
    if (err == cudaSuccess) {
        kern::stats_merge_kernel<<<merge_grid(d.C), kMergeThreads, 0, stream>>>(
                ws, ws + parts, ws + 2 * parts, d.C, static_cast<int>(P.split), mean, m2);
        err = cudaGetLastError();
    }
    const cudaError_t ferr = cudaFreeAsync(ws, stream);
    return err != cudaSuccess ? err : ferr;
}

template <typename T, int V, int A>
cudaError_t act_backward_reduce_rows(
        const T* dy, const T* y, const T* x, const Dims3& d, const float* mean, const float* invstd,
        const float* weight, const float* bias, float* sum_dz, float* sum_dz_xhat, cudaStream_t stream) {
    constexpr int U = ReduceUnroll<V>::value;
    const Rows R = make_rows(d, V);
    const ReducePlan P = reduce_plan(d.C, R.nvec, U);
    const unsigned gy = channel_grid(d.C);
    if (P.split == 1) {
        kern::act_backward_reduce_rows_kernel<T, V, U, A><<<dim3(1, gy), P.threads, 0, stream>>>(
                dy, y, x, R, P.chunk, mean, invstd, weight, bias, sum_dz, sum_dz_xhat);
        return cudaGetLastError();
    }
    const size_t parts = static_cast<size_t>(d.C) * P.split;
    float* ws = nullptr;
    cudaError_t err = workspace(&ws, 2 * parts, stream);
    if (err != cudaSuccess) {  // no stream-ordered memory here (an old driver): one block per channel
        (void)cudaGetLastError();
        kern::act_backward_reduce_rows_kernel<T, V, U, A><<<dim3(1, gy), P.threads, 0, stream>>>(
                dy, y, x, R, R.nvec, mean, invstd, weight, bias, sum_dz, sum_dz_xhat);
        return cudaGetLastError();
    }
    kern::act_backward_reduce_rows_kernel<T, V, U, A><<<dim3(P.split, gy), P.threads, 0, stream>>>(
            dy, y, x, R, P.chunk, mean, invstd, weight, bias, ws, ws + parts);
    err = cudaGetLastError();
    if (err == cudaSuccess) {
        kern::sum2_merge_kernel<<<merge_grid(d.C), kMergeThreads, 0, stream>>>(
                ws, ws + parts, d.C, static_cast<int>(P.split), invstd, sum_dz, sum_dz_xhat);
        err = cudaGetLastError();
    }
    const cudaError_t ferr = cudaFreeAsync(ws, stream);
    return err != cudaSuccess ? err : ferr;
}

template <typename T, int V, int A>
cudaError_t act_normalize_rows(
        const T* x, const T* sc, const Dims3& d, const float* mean, const float* invstd, const float* weight,
        const float* bias, T* y, cudaStream_t stream) {
    constexpr int U = kElemUnroll;
    const Rows R = make_rows(d, V);
    const dim3 grid(elem_rows_blocks(d.C, R.nvec, U), channel_grid(d.C));
    if (sc != nullptr)
        kern::act_normalize_rows_kernel<T, V, U, A, true><<<grid, kElemThreads, 0, stream>>>(
                x, sc, R, mean, invstd, weight, bias, y);
    else
        kern::act_normalize_rows_kernel<T, V, U, A, false><<<grid, kElemThreads, 0, stream>>>(
                x, nullptr, R, mean, invstd, weight, bias, y);
    return cudaGetLastError();
}

template <typename T, int V, int A>
cudaError_t act_backward_elemt_rows(
        const T* dy, const T* y, const T* x, const Dims3& d, const float* mean, const float* invstd,
        const float* weight, const float* bias, const float* sum_dz, const float* sum_dz_xhat, double inv_count,
        T* dx, T* ds, cudaStream_t stream) {
    constexpr int U = kElemUnroll;
    const Rows R = make_rows(d, V);
    const dim3 grid(elem_rows_blocks(d.C, R.nvec, U), channel_grid(d.C));
    if (ds != nullptr)
        kern::act_backward_elemt_rows_kernel<T, V, U, A, true><<<grid, kElemThreads, 0, stream>>>(
                dy, y, x, R, mean, invstd, weight, bias, sum_dz, sum_dz_xhat, inv_count, dx, ds);
    else
        kern::act_backward_elemt_rows_kernel<T, V, U, A, false><<<grid, kElemThreads, 0, stream>>>(
                dy, y, x, R, mean, invstd, weight, bias, sum_dz, sum_dz_xhat, inv_count, dx, nullptr);
    return cudaGetLastError();
}

// f(T()) with T = float or uint16_t (float16 bits): the kernels' element type, chosen at run time
template <typename F>
cudaError_t dispatch(int dtype, F&& f) {
    if (dtype == BASEBN_BN_FLOAT32)
        return f(float());
    return f(uint16_t());
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
    const size_t esize = x->dtype == BASEBN_BN_FLOAT32 ? 4 : 2;
    const int vec = rows_vec(is_contiguous(x) && !force_strided, d, esize, {x->data});
    return dispatch(x->dtype, [&](auto tag) {
        using T = decltype(tag);
        const T* px = static_cast<const T*>(x->data);
        if (vec == 4)
            return stats_rows<T, 4>(px, d, mean, m2, stream);
        if (vec == 1)
            return stats_rows<T, 1>(px, d, mean, m2, stream);
        kern::stats_kernel<T, false><<<reduce_grid(d), reduce_block(d.S), 0, stream>>>(px, L, d.N, d.C, d.S, mean, m2);
        return cudaGetLastError();
    });
}

// ------------------------------------------------------------------ fused BN -> activation
namespace basebn {
namespace cuda {
namespace {

bool valid_act(int act) {
    return act == kBnActIdentity || act == kBnActRelu || act == kBnActRelu6 || act == kBnActSilu ||
           act == kBnActHswish;
}

// f(T(), Act()) for the run-time dtype and activation code (valid_act checked)
template <typename F>
cudaError_t dispatch_act(int dtype, int act, F&& f) {
    return dispatch(dtype, [&](auto tag) {
        if (act == kBnActRelu)
            return f(tag, std::integral_constant<int, kBnActRelu>());
        if (act == kBnActRelu6)
            return f(tag, std::integral_constant<int, kBnActRelu6>());
        if (act == kBnActSilu)
            return f(tag, std::integral_constant<int, kBnActSilu>());
        if (act == kBnActHswish)
            return f(tag, std::integral_constant<int, kBnActHswish>());
        return f(tag, std::integral_constant<int, kBnActIdentity>());
    });
}

// y of an act backward: x's shape and dtype, or NULL where it is not read (identity, SiLU, HSwish: then x's
// layout stands in)
bool valid_output_like(const BasebnBnTensor* y, const BasebnBnTensor* x, int act) {
    if ((act == kBnActIdentity || bn_act_from_pre(act)) && y == nullptr)
        return true;
    return valid(y) && same_shape(y, x) && (y->data != nullptr || numel(dims_of(x)) == 0);
}

size_t elem_size(const BasebnBnTensor* t) {
    return t->dtype == BASEBN_BN_FLOAT32 ? 4 : 2;
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
    const void* psc = shortcut != nullptr ? shortcut->data : nullptr;
    const int vec = rows_vec(contig, d, elem_size(x), {x->data, psc, y});
    return dispatch_act(x->dtype, act, [&](auto tag, auto act_c) {
        using T = decltype(tag);
        constexpr int A = decltype(act_c)::value;
        const T* px = static_cast<const T*>(x->data);
        const T* ps = static_cast<const T*>(psc);
        T* py = static_cast<T*>(y);
        if (vec == 4)
            return act_normalize_rows<T, 4, A>(px, ps, d, mean, invstd, weight, bias, py, stream);
        if (vec == 1)
            return act_normalize_rows<T, 1, A>(px, ps, d, mean, invstd, weight, bias, py, stream);
        if (ps != nullptr)
            kern::act_normalize_kernel<T, false, A, true><<<elem_grid(d), kElemThreads, 0, stream>>>(
                    px, L, ps, Ls, d.N, d.C, d.S, mean, invstd, weight, bias, py);
        else
            kern::act_normalize_kernel<T, false, A, false><<<elem_grid(d), kElemThreads, 0, stream>>>(
                    px, L, nullptr, Ls, d.N, d.C, d.S, mean, invstd, weight, bias, py);
        return cudaGetLastError();
    });
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
    const int vec = rows_vec(contig, d, elem_size(x), {dy->data, yv->data, x->data});
    return dispatch_act(x->dtype, act, [&](auto tag, auto act_c) {
        using T = decltype(tag);
        constexpr int A = decltype(act_c)::value;
        const T* pg = static_cast<const T*>(dy->data);
        const T* py = static_cast<const T*>(yv->data);
        const T* px = static_cast<const T*>(x->data);
        if (vec == 4)
            return act_backward_reduce_rows<T, 4, A>(pg, py, px, d, mean, invstd, weight, bias, sum_dz, sum_dz_xhat,
                                                     stream);
        if (vec == 1)
            return act_backward_reduce_rows<T, 1, A>(pg, py, px, d, mean, invstd, weight, bias, sum_dz, sum_dz_xhat,
                                                     stream);
        kern::act_backward_reduce_kernel<T, false, A><<<reduce_grid(d), reduce_block(d.S), 0, stream>>>(
                pg, Lg, py, Ly, px, Lx, d.N, d.C, d.S, mean, invstd, weight, bias, sum_dz, sum_dz_xhat);
        return cudaGetLastError();
    });
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
    const int vec = rows_vec(contig, d, elem_size(x), {dy->data, yv->data, x->data, dx, dshortcut});
    const double inv_count = count > 0.0 ? 1.0 / count : 0.0;
    return dispatch_act(x->dtype, act, [&](auto tag, auto act_c) {
        using T = decltype(tag);
        constexpr int A = decltype(act_c)::value;
        const T* pg = static_cast<const T*>(dy->data);
        const T* py = static_cast<const T*>(yv->data);
        const T* px = static_cast<const T*>(x->data);
        T* pdx = static_cast<T*>(dx);
        T* pds = static_cast<T*>(dshortcut);
        if (vec == 4)
            return act_backward_elemt_rows<T, 4, A>(pg, py, px, d, mean, invstd, weight, bias, sum_dz, sum_dz_xhat,
                                                    inv_count, pdx, pds, stream);
        if (vec == 1)
            return act_backward_elemt_rows<T, 1, A>(pg, py, px, d, mean, invstd, weight, bias, sum_dz, sum_dz_xhat,
                                                    inv_count, pdx, pds, stream);
        if (pds != nullptr)
            kern::act_backward_elemt_kernel<T, false, A, true><<<elem_grid(d), kElemThreads, 0, stream>>>(
                    pg, Lg, py, Ly, px, Lx, d.N, d.C, d.S, mean, invstd, weight, bias, sum_dz, sum_dz_xhat, inv_count,
                    pdx, pds);
        else
            kern::act_backward_elemt_kernel<T, false, A, false><<<elem_grid(d), kElemThreads, 0, stream>>>(
                    pg, Lg, py, Ly, px, Lx, d.N, d.C, d.S, mean, invstd, weight, bias, sum_dz, sum_dz_xhat, inv_count,
                    pdx, nullptr);
        return cudaGetLastError();
    });
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
