// Entry points of the fused BN -> activation kernels (BN [+ shortcut] -> act), one set per device.
// Registration lives in bn_ops.cpp; the per-element math (bn_act_apply, bn_act_grad) in bn_math.h.
// x / dy / y / shortcut: (N, C, *) of one dtype, float32 or float16; per-channel tensors: float32 (C,).
// act is a BnAct code. The statistics come from the unfused ops (stats, or SyncBN's collective).
//   act_normalize:        y = act(pre),  pre = (x - mean) * invstd * w + b [+ shortcut]
//   act_backward_reduce:  dz = act'(pre) * dy;  sum_dz = sum(dz),  sum_dz_xhat = invstd * sum(dz * (x - mean))
//   act_backward_elemt:   dx = w * invstd * (dz - sum_dz / count - (x - mean) * invstd * sum_dz_xhat / count),
//                         and dshortcut = dz when dshortcut is given
// What the backward reads for act' (bn_math.h): ReLU / ReLU6 the forward's output y; SiLU / HSwish not y
// but pre, recomputed from x, mean, invstd, w and b (no residual form: the shortcut is not an input);
// the identity neither. weight / bias / shortcut may be nullptr (w = 1, b = 0).
#pragma once

#include "bn_kernels.h"

namespace basebn {

#define BASEBN_DECLARE_BN_ACT_KERNELS                                                          \
    void act_normalize(                                                                        \
            const custom::Tensor& x, const custom::Tensor* shortcut, const custom::Tensor& mean, \
            const custom::Tensor& invstd, const custom::Tensor* weight,                        \
            const custom::Tensor* bias, int act, custom::Tensor& y, bool force_strided);       \
    void act_backward_reduce(                                                                  \
            const custom::Tensor& dy, const custom::Tensor& y, const custom::Tensor& x,        \
            const custom::Tensor& mean, const custom::Tensor& invstd,                          \
            const custom::Tensor* weight, const custom::Tensor* bias, int act,                 \
            custom::Tensor& sum_dz, custom::Tensor& sum_dz_xhat, bool force_strided);          \
    void act_backward_elemt(                                                                   \
            const custom::Tensor& dy, const custom::Tensor& y, const custom::Tensor& x,        \
            const custom::Tensor& mean, const custom::Tensor& invstd,                          \
            const custom::Tensor* weight, const custom::Tensor* bias,                          \
            const custom::Tensor& sum_dz, const custom::Tensor& sum_dz_xhat, double count,     \
            int act, custom::Tensor& dx, custom::Tensor* dshortcut, bool force_strided);

namespace cpu {
BASEBN_DECLARE_BN_ACT_KERNELS

// One-call local training passes (bn_train_cpu.cpp; CPU only, no SyncBN):
//   act_train_forward:  mean, m2 (as stats), invstd = 1 / sqrt(m2 / count + eps), y (as act_normalize)
//   act_train_backward: sum_dz, sum_dz_xhat (as act_backward_reduce), dx [, dshortcut] (as act_backward_elemt
//                       with count = N * S)
void act_train_forward(const custom::Tensor& x, const custom::Tensor* shortcut, const custom::Tensor* weight,
                       const custom::Tensor* bias, double eps, int act, custom::Tensor& y, custom::Tensor& mean,
                       custom::Tensor& m2, custom::Tensor& invstd, bool force_strided);
void act_train_backward(const custom::Tensor& dy, const custom::Tensor& y, const custom::Tensor& x,
                        const custom::Tensor& mean, const custom::Tensor& invstd, const custom::Tensor* weight,
                        const custom::Tensor* bias, int act, custom::Tensor& dx, custom::Tensor* dshortcut,
                        custom::Tensor& sum_dz, custom::Tensor& sum_dz_xhat, bool force_strided);
}  // namespace cpu

namespace running {
// The guarded running-statistics update (bn_running_cpu.cpp) of C channels from the batch's mean and unbiased
// variance: running' = running * keep + batch * (1 - keep) when every batch value is finite, else running' =
// running and bad' = bad + 1.
void update(const custom::Tensor& running_mean, const custom::Tensor& running_var, const float* mean,
            const float* var, const custom::Tensor& bad, double keep, custom::Tensor& running_mean_out,
            custom::Tensor& running_var_out, custom::Tensor& bad_out);
}  // namespace running

#ifdef BASEBN_WITH_CUDA
namespace cuda {
BASEBN_DECLARE_BN_ACT_KERNELS
}  // namespace cuda
#endif

#undef BASEBN_DECLARE_BN_ACT_KERNELS

}  // namespace basebn
