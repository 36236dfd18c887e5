// Entry points of the BatchNorm kernels, one set per device. Registration lives in bn_ops.cpp.
// x / dy: (N, C, *) float32 or float16 (2 to 5 dims); per-channel tensors: float32 (C,).
// weight / bias may be nullptr (weight = 1, bias = 0).
#pragma once

#include <cstdint>

#include "megbrain/custom/custom.h"

namespace basebn {

// An (N, C, *) tensor seen as N x C x S, S = the product of the trailing dims.
struct Dims {
    int64_t N, C, S;
};

inline Dims dims_of(const custom::Tensor& t) {
    const auto sh = t.shape();
    Dims d{static_cast<int64_t>(sh[0]), static_cast<int64_t>(sh[1]), 1};
    for (size_t i = 2; i < sh.ndim(); ++i)
        d.S *= static_cast<int64_t>(sh[i]);
    return d;
}

#define BASEBN_DECLARE_BN_KERNELS                                                     \
    void stats(const custom::Tensor& x, custom::Tensor& mean, custom::Tensor& m2,     \
               bool force_strided);                                                   \
    void normalize(                                                                   \
            const custom::Tensor& x, const custom::Tensor& mean,                      \
            const custom::Tensor& invstd, const custom::Tensor* weight,               \
            const custom::Tensor* bias, custom::Tensor& y, bool force_strided);       \
    void backward_reduce(                                                             \
            const custom::Tensor& dy, const custom::Tensor& x,                        \
            const custom::Tensor& mean, const custom::Tensor& invstd,                 \
            custom::Tensor& sum_dy, custom::Tensor& sum_dy_xhat, bool force_strided); \
    void backward_elemt(                                                              \
            const custom::Tensor& dy, const custom::Tensor& x,                        \
            const custom::Tensor& mean, const custom::Tensor& invstd,                 \
            const custom::Tensor* weight, const custom::Tensor& sum_dy,               \
            const custom::Tensor& sum_dy_xhat, double count, custom::Tensor& dx,      \
            bool force_strided);

namespace cpu {
BASEBN_DECLARE_BN_KERNELS
}  // namespace cpu

#ifdef BASEBN_WITH_CUDA
namespace cuda {
BASEBN_DECLARE_BN_KERNELS
}  // namespace cuda
#endif

#undef BASEBN_DECLARE_BN_KERNELS

}  // namespace basebn
