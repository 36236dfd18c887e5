// Gathering a strided (non-contiguous) custom-op tensor into a contiguous buffer, shared by the BN, conv and
// pooling CPU kernels: MegEngine may hand a custom op a non-contiguous view. The copy itself: strided_rows.h.
#pragma once

#include <cstdint>
#include <vector>

#include "megbrain/custom/custom.h"
#include "strided_rows.h"

namespace basebn {

// Copy t's elements into buf in row-major order (t's shape, its own strides); returns buf.data().
template <typename T>
const T* gather_strided(const custom::Tensor& t, std::vector<T>& buf) {
    const auto sh = t.shape();
    const auto st = t.stride();
    const int nd = static_cast<int>(sh.ndim());
    int64_t shape[strided::kMaxDims], stride[strided::kMaxDims];
    custom_assert(nd <= strided::kMaxDims, "gather_strided: %d dimensions, at most %d", nd, strided::kMaxDims);
    for (int d = 0; d < nd; ++d) {
        shape[d] = static_cast<int64_t>(sh[d]);
        stride[d] = static_cast<int64_t>(st[d]);
    }
    buf.resize(t.size());
    strided::gather(t.data<T>(), shape, stride, nd, static_cast<int64_t>(buf.size()), buf.data());
    return buf.data();
}

}  // namespace basebn
