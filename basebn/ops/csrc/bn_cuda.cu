// MegEngine glue of the CUDA BatchNorm kernels (compiled and registered only with -DBASEBN_WITH_CUDA):
// custom::Tensor -> BasebnBnTensor (pointer, dtype, shape, strides) and the op's stream, then the
// standalone launchers of bn_cuda_launch.h (kernels in bn_cuda_kernels.cuh; no MegEngine there).
#include <cuda_runtime.h>

#include "bn_cuda_launch.h"
#include "bn_kernels.h"
#include "megbrain/custom/platform/custom_cuda.h"

namespace basebn {
namespace cuda {

using custom::DTypeEnum;
using custom::Tensor;

namespace {

BasebnBnTensor view_of(const Tensor& t) {
    BasebnBnTensor v;
    const auto sh = t.shape();
    const auto st = t.stride();
    v.ndim = static_cast<int>(sh.ndim());
    custom_assert(v.ndim >= 2 && v.ndim <= BASEBN_BN_MAX_DIMS, "basebn BN kernels take 2 to 5 dims");
    const auto e = t.dtype().enumv();
    custom_assert(e == DTypeEnum::float32 || e == DTypeEnum::float16, "x must be float32 or float16");
    v.dtype = e == DTypeEnum::float32 ? BASEBN_BN_FLOAT32 : BASEBN_BN_FLOAT16;
    v.data = t.data();
    for (int i = 0; i < BASEBN_BN_MAX_DIMS; ++i) {
        v.shape[i] = i < v.ndim ? static_cast<int64_t>(sh[i]) : 1;
        v.stride[i] = i < v.ndim ? static_cast<int64_t>(st[i]) : 0;
    }
    return v;
}

const float* channel_ptr(const Tensor* t) {
    if (t == nullptr)
        return nullptr;
    custom_assert(t->is_contiguous(), "per-channel tensors must be contiguous");
    return t->data<float>();
}

void check(cudaError_t err, const char* what) {
    custom_assert(err == cudaSuccess, "%s: %s", what, cudaGetErrorString(err));
}

}  // namespace

void stats(const Tensor& x, Tensor& mean, Tensor& m2, bool force_strided) {
    const BasebnBnTensor vx = view_of(x);
    check(basebn_bn_cuda_stats(&vx, mean.data<float>(), m2.data<float>(), force_strided,
                               custom::get_cuda_stream(x.device())),
          "basebn stats_kernel");
}

void normalize(
        const Tensor& x, const Tensor& mean, const Tensor& invstd, const Tensor* weight,
        const Tensor* bias, Tensor& y, bool force_strided) {
    if (x.size() == 0)
        return;
    const BasebnBnTensor vx = view_of(x);
    check(basebn_bn_cuda_normalize(&vx, channel_ptr(&mean), channel_ptr(&invstd), channel_ptr(weight),
                                   channel_ptr(bias), y.data(), force_strided,
                                   custom::get_cuda_stream(x.device())),
          "basebn normalize_kernel");
}

void backward_reduce(
        const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& invstd,
        Tensor& sum_dy, Tensor& sum_dy_xhat, bool force_strided) {
    const BasebnBnTensor vg = view_of(dy), vx = view_of(x);
    custom_assert(vg.dtype == vx.dtype, "dy and x dtypes differ");
    const bool empty = x.size() == 0;  // (mean / invstd are not read then)
    check(basebn_bn_cuda_backward_reduce(&vg, &vx, empty ? nullptr : channel_ptr(&mean),
                                         empty ? nullptr : channel_ptr(&invstd), sum_dy.data<float>(),
                                         sum_dy_xhat.data<float>(), force_strided,
                                         custom::get_cuda_stream(x.device())),
          "basebn backward_reduce_kernel");
}

void backward_elemt(
        const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& invstd,
        const Tensor* weight, const Tensor& sum_dy, const Tensor& sum_dy_xhat, double count,
        Tensor& dx, bool force_strided) {
    if (x.size() == 0)
        return;
    const BasebnBnTensor vg = view_of(dy), vx = view_of(x);
    custom_assert(vg.dtype == vx.dtype, "dy and x dtypes differ");
    check(basebn_bn_cuda_backward_elemt(&vg, &vx, channel_ptr(&mean), channel_ptr(&invstd),
                                        channel_ptr(weight), channel_ptr(&sum_dy),
                                        channel_ptr(&sum_dy_xhat), count, dx.data(), force_strided,
                                        custom::get_cuda_stream(x.device())),
          "basebn backward_elemt_kernel");
}

}  // namespace cuda
}  // namespace basebn

// ------------------------------------------------------------------ fused BN -> activation (bn_act_kernels.h)
#include "bn_act_kernels.h"

namespace basebn {
namespace cuda {

void act_normalize(
        const Tensor& x, const Tensor* shortcut, const Tensor& mean, const Tensor& invstd, const Tensor* weight,
        const Tensor* bias, int act, Tensor& y, bool force_strided) {
    if (x.size() == 0)
        return;
    const BasebnBnTensor vx = view_of(x);
    BasebnBnTensor vs;
    if (shortcut != nullptr)
        vs = view_of(*shortcut);
    check(basebn_bn_cuda_act_normalize(&vx, shortcut != nullptr ? &vs : nullptr, channel_ptr(&mean),
                                       channel_ptr(&invstd), channel_ptr(weight), channel_ptr(bias), act,
                                       y.data(), force_strided, custom::get_cuda_stream(x.device())),
          "basebn act_normalize_kernel");
}

void act_backward_reduce(
        const Tensor& dy, const Tensor& y, const Tensor& x, const Tensor& mean, const Tensor& invstd,
        const Tensor* weight, const Tensor* bias, int act, Tensor& sum_dz, Tensor& sum_dz_xhat, bool force_strided) {
    const BasebnBnTensor vg = view_of(dy), vy = view_of(y), vx = view_of(x);
    const bool empty = x.size() == 0;  // (the per-channel tensors are not read then)
    check(basebn_bn_cuda_act_backward_reduce(&vg, &vy, &vx, empty ? nullptr : channel_ptr(&mean),
                                             empty ? nullptr : channel_ptr(&invstd),
                                             empty ? nullptr : channel_ptr(weight),
                                             empty ? nullptr : channel_ptr(bias), act, sum_dz.data<float>(),
                                             sum_dz_xhat.data<float>(), force_strided,
                                             custom::get_cuda_stream(x.device())),
          "basebn act_backward_reduce_kernel");
}

void act_backward_elemt(
        const Tensor& dy, const Tensor& y, const Tensor& x, const Tensor& mean, const Tensor& invstd,
        const Tensor* weight, const Tensor* bias, const Tensor& sum_dz, const Tensor& sum_dz_xhat, double count,
        int act, Tensor& dx, Tensor* dshortcut, bool force_strided) {
    if (x.size() == 0)
        return;
    const BasebnBnTensor vg = view_of(dy), vy = view_of(y), vx = view_of(x);
    check(basebn_bn_cuda_act_backward_elemt(&vg, &vy, &vx, channel_ptr(&mean), channel_ptr(&invstd),
                                            channel_ptr(weight), channel_ptr(bias), channel_ptr(&sum_dz),
                                            channel_ptr(&sum_dz_xhat),
                                            count, act, dx.data(), dshortcut != nullptr ? dshortcut->data() : nullptr,
                                            force_strided, custom::get_cuda_stream(x.device())),
          "basebn act_backward_elemt_kernel");
}

}  // namespace cuda
}  // namespace basebn
