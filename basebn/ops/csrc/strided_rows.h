// Gathering a strided view (shape and strides in elements, strides >= 0) into a contiguous row-major buffer, on
// raw pointers: strided_copy.h's gather_strided for custom-op tensors, tests/support/gather_harness.cpp alone.
//
// Row by row: dimensions that are contiguous with each other are merged first, then each row of the innermost
// dimension is a memcpy (stride 1), a fill (stride 0) or a strided loop; an offset computed from all the indices
// of every value costs ~1 ms of a MobileNetV2 step, in the ~600 per-channel vectors a step copies
// (results/serial_time.json). One thread: in the test suite and in a training step MegEngine hands the ops
// contiguous tensors, and what goes through here is per-channel vectors.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace basebn {
namespace strided {

constexpr int kMaxDims = 8;

// the view's n values (shape, stride: nd <= kMaxDims dimensions) of src into dst
template <typename T>
void gather(const T* src, const int64_t* shape, const int64_t* stride, int nd, int64_t n, T* dst) {
    if (n == 0)
        return;
    int64_t dims[kMaxDims], strides[kMaxDims];  // size-1 dimensions dropped, contiguous neighbours merged
    int m = 0;
    for (int d = 0; d < nd; ++d) {
        if (shape[d] == 1)
            continue;
        if (m > 0 && strides[m - 1] == stride[d] * shape[d]) {
            dims[m - 1] *= shape[d];
            strides[m - 1] = stride[d];
        } else {
            dims[m] = shape[d];
            strides[m] = stride[d];
            ++m;
        }
    }
    if (m == 0) {  // a single value
        dst[0] = src[0];
        return;
    }
    const int64_t inner = dims[m - 1], inner_stride = strides[m - 1];
    int64_t idx[kMaxDims] = {0};
    int64_t offset = 0;
    for (T* out = dst; out < dst + n; out += inner) {
        const T* row = src + offset;
        if (inner_stride == 1)
            std::memcpy(out, row, static_cast<size_t>(inner) * sizeof(T));
        else if (inner_stride == 0)
            std::fill(out, out + inner, row[0]);
        else
            for (int64_t i = 0; i < inner; ++i)
                out[i] = row[i * inner_stride];
        for (int d = m - 2; d >= 0; --d) {  // the next row's offset
            offset += strides[d];
            if (++idx[d] < dims[d])
                break;
            offset -= idx[d] * strides[d];
            idx[d] = 0;
        }
    }
}

}  // namespace strided
}  // namespace basebn
