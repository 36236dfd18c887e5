// Gathering a strided view (shape and strides in elements, strides >= 0) into a contiguous row-major buffer, on
// raw pointers: strided_copy.h's gather_strided for custom-op tensors, tests/support/gather_harness.cpp alone.
//
// Row by row: dimensions that are contiguous with each other are merged first, then each row of the innermost
// dimension is a memcpy (stride 1), a fill (stride 0) or a strided loop; rows are split over OpenMP's default
// team from 64 K values on. (Until 2026-11-27 every value's offset was computed from all its indices, on one
// thread: ~1 ms of every MobileNetV2 step, in the ~600 per-channel vectors a step copies.)
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace basebn {
namespace strided {

constexpr int kMaxDims = 8;
constexpr int64_t kParallelValues = int64_t(1) << 16;

// shape / stride with size-1 dimensions dropped and contiguous neighbours merged, outermost first, into dims /
// strides (kMaxDims each); returns how many are left (0: a single value), or -1 for more than kMaxDims
inline int merged_dims(const int64_t* shape, const int64_t* stride, int nd, int64_t* dims, int64_t* strides) {
    int m = 0;
    for (int d = 0; d < nd; ++d) {
        if (shape[d] == 1)
            continue;
        if (m > 0 && strides[m - 1] == stride[d] * shape[d]) {
            dims[m - 1] *= shape[d];
            strides[m - 1] = stride[d];
        } else {
            if (m == kMaxDims)
                return -1;
            dims[m] = shape[d];
            strides[m] = stride[d];
            ++m;
        }
    }
    return m;
}

// rows [r0, r1) of the (outer dims..., inner) view into dst + r0 * inner
template <typename T>
void copy_rows(const T* src, T* dst, const int64_t* dims, const int64_t* strides, int m, int64_t r0, int64_t r1) {
    const int64_t inner = dims[m - 1], inner_stride = strides[m - 1];
    int64_t idx[kMaxDims] = {0};
    int64_t offset = 0;
    for (int64_t rest = r0, d = m - 2; d >= 0; --d) {  // the multi-index of row r0
        idx[d] = rest % dims[d];
        rest /= dims[d];
        offset += idx[d] * strides[d];
    }
    for (int64_t r = r0; r < r1; ++r) {
        const T* row = src + offset;
        T* out = dst + r * inner;
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

// the n values of the view (shape, stride, nd) of src into dst; false for more than kMaxDims dimensions
template <typename T>
bool gather(const T* src, const int64_t* shape, const int64_t* stride, int nd, int64_t n, T* dst) {
    if (n == 0)
        return true;
    int64_t dims[kMaxDims], strides[kMaxDims];
    const int m = merged_dims(shape, stride, nd, dims, strides);
    if (m < 0)
        return false;
    if (m == 0) {
        dst[0] = src[0];
        return true;
    }
    const int64_t rows = n / dims[m - 1];
    const bool parallel = n >= kParallelValues && rows > 1;
    (void)parallel;  // (unused without OpenMP)
#pragma omp parallel if (parallel)
    {
#ifdef _OPENMP
        const int64_t parts = omp_get_num_threads(), part = omp_get_thread_num();
#else
        const int64_t parts = 1, part = 0;
#endif
        copy_rows(src, dst, dims, strides, m, rows * part / parts, rows * (part + 1) / parts);
    }
    return true;
}

}  // namespace strided
}  // namespace basebn
