/* Standalone CUDA BatchNorm launchers: raw device pointers, sizes, strides and a stream; no MegEngine.
 *
 * A C API (plain C structs, extern "C" functions): bn_cuda.cu (the MegEngine glue) calls it, and so does
 * benchmarks/cuda/run_harness.py through ctypes on a shared library built from bn_cuda_launch.cu alone.
 * Conventions (as bn_math.h): x, dy are (N, C, *) with 2 to 5 dims, S = the product of the trailing dims;
 * per-channel arrays are contiguous float32 device arrays of C values; weight / bias may be NULL
 * (weight = 1, bias = 0); y and dx are written contiguous (N, C, *) in x's dtype.
 *   stats:            mean = sum(x) / cnt,  m2 = sum((x - mean)^2)           (cnt = N * S)
 *   normalize:        y = (x - mean) * invstd * weight + bias
 *   backward_reduce:  sum_dy = sum(dy),  sum_dy_xhat = invstd * sum(dy * (x - mean))
 *   backward_elemt:   dx = weight * invstd * (dy - sum_dy / count - (x - mean) * invstd * sum_dy_xhat / count)
 * `count` is the global per-channel count (larger than N * S under SyncBN). Empty inputs: stats and
 * backward_reduce write zeros, the others do nothing. Every call is asynchronous on `stream` and returns
 * cudaSuccess, cudaErrorInvalidValue (bad arguments: nothing launched) or the launch error.
 * force_strided != 0 makes the kernels address every element through its strides (the non-contiguous path).
 */
#pragma once

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define BASEBN_BN_FLOAT32 0
#define BASEBN_BN_FLOAT16 1 /* IEEE binary16 as raw 16 bits; statistics stay float32 */
#define BASEBN_BN_MAX_DIMS 5

/* An (N, C, *) tensor on the device: element strides, any layout. */
typedef struct BasebnBnTensor {
    const void* data;
    int dtype; /* BASEBN_BN_FLOAT32 or BASEBN_BN_FLOAT16 */
    int ndim;  /* 2 to 5 */
    int64_t shape[BASEBN_BN_MAX_DIMS];
    int64_t stride[BASEBN_BN_MAX_DIMS]; /* in elements */
} BasebnBnTensor;

cudaError_t basebn_bn_cuda_stats(
        const BasebnBnTensor* x, float* mean, float* m2, int force_strided, cudaStream_t stream);

cudaError_t basebn_bn_cuda_normalize(
        const BasebnBnTensor* x, const float* mean, const float* invstd, const float* weight,
        const float* bias, void* y, int force_strided, cudaStream_t stream);

cudaError_t basebn_bn_cuda_backward_reduce(
        const BasebnBnTensor* dy, const BasebnBnTensor* x, const float* mean, const float* invstd,
        float* sum_dy, float* sum_dy_xhat, int force_strided, cudaStream_t stream);

cudaError_t basebn_bn_cuda_backward_elemt(
        const BasebnBnTensor* dy, const BasebnBnTensor* x, const float* mean, const float* invstd,
        const float* weight, const float* sum_dy, const float* sum_dy_xhat, double count, void* dx,
        int force_strided, cudaStream_t stream);

/* Fused BN -> activation (the element-wise passes; statistics from the calls above). act: a BnAct code of
 * bn_math.h (0 identity, 1 ReLU, 2 ReLU6, 3 SiLU, 4 HSwish). y = act(pre), pre = normalize(x) [+ shortcut];
 * dz = act'(pre) * dy with the derivative read from the forward's output y for ReLU / ReLU6, and for SiLU /
 * HSwish taken at pre recomputed from x, mean, invstd, weight and bias (no residual form there: the backward
 * has no shortcut input). y is not read for the identity, SiLU and HSwish (it may be NULL then).
 * act_backward_reduce: sum_dz, sum_dz_xhat as backward_reduce of dz; act_backward_elemt: dx as backward_elemt
 * of dz, and dshortcut = dz when dshortcut is not NULL. shortcut / y / dy have x's shape and dtype. */
cudaError_t basebn_bn_cuda_act_normalize(
        const BasebnBnTensor* x, const BasebnBnTensor* shortcut, const float* mean, const float* invstd,
        const float* weight, const float* bias, int act, void* y, int force_strided, cudaStream_t stream);

cudaError_t basebn_bn_cuda_act_backward_reduce(
        const BasebnBnTensor* dy, const BasebnBnTensor* y, const BasebnBnTensor* x, const float* mean,
        const float* invstd, const float* weight, const float* bias, int act, float* sum_dz, float* sum_dz_xhat,
        int force_strided, cudaStream_t stream);

cudaError_t basebn_bn_cuda_act_backward_elemt(
        const BasebnBnTensor* dy, const BasebnBnTensor* y, const BasebnBnTensor* x, const float* mean,
        const float* invstd, const float* weight, const float* bias, const float* sum_dz, const float* sum_dz_xhat,
        double count, int act, void* dx, void* dshortcut, int force_strided, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
