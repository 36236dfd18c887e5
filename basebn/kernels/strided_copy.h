// Gathering a strided (non-contiguous) custom-op tensor into a contiguous buffer, shared by the BN
// and conv CPU kernels: MegEngine may hand a custom op a non-contiguous view.
#pragma once

#include <cstdint>
#include <vector>

#include "megbrain/custom/custom.h"

namespace basebn {

// Copy t's elements into buf in row-major order (t's shape, its own strides); returns buf.data().
template <typename T>
const T* gather_strided(const custom::Tensor& t, std::vector<T>& buf) {
    const auto sh = t.shape();
    const auto st = t.stride();
    const int nd = static_cast<int>(sh.ndim());
    buf.resize(t.size());
    const T* src = t.data<T>();
    std::vector<int64_t> idx(nd, 0);
    for (size_t i = 0; i < buf.size(); ++i) {
        int64_t off = 0;
        for (int d = 0; d < nd; ++d)
            off += idx[d] * st[d];
        buf[i] = src[off];
        for (int d = nd - 1; d >= 0; --d) {
            if (++idx[d] < static_cast<int64_t>(sh[d]))
                break;
            idx[d] = 0;
        }
    }
    return buf.data();
}

}  // namespace basebn
