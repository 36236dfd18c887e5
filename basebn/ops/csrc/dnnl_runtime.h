// The oneDNN CPU engine and the OpenMP thread count of a call, shared by the oneDNN ops (conv_dnnl.cpp,
// pool_dnnl.cpp, matmul_dnnl.cpp): one engine for the library, and the same thread rule everywhere.
// Compiled only with -DBASEBN_WITH_DNNL.
#pragma once

#include <omp.h>

#include <cstdlib>

#include <oneapi/dnnl/dnnl.hpp>
#include <vector>

#include "megbrain/custom/custom.h"
#include "strided_copy.h"
#include "thread_env.h"

namespace basebn {
namespace dnnl_rt {

// The CPU engine (one per process: inline, so every translation unit shares it).
inline dnnl::engine& engine() {
    static dnnl::engine e(dnnl::engine::kind::cpu, 0);
    return e;
}

// Threads for this call: $BASEBN_NUM_THREADS (thread_env.h), else the OpenMP default seen on the first call. Sets it
// as the calling thread's OpenMP default (oneDNN's primitives and the ops' own parallel loops use it) and returns it.
inline int set_threads() {
    static const int default_threads = omp_get_max_threads();
    const int v = env_threads();
    const int n = v > 0 ? v : default_threads;
    omp_set_num_threads(n);
    return n;
}

// A contiguous float32 view of t: t's memory, or a strided gather into buf (`op` names the caller in the error).
inline const float* contiguous_f32(const custom::Tensor& t, std::vector<float>& buf, const char* op) {
    custom_assert(t.dtype().enumv() == custom::DTypeEnum::float32, "%s: tensors must be float32, got %s", op,
                  t.dtype().str().c_str());
    if (t.is_contiguous())
        return t.data<float>();
    return gather_strided(t, buf);
}

// Custom-op inference shared by the conv and pool ops: outputs on input 0's device and format, float32.
inline void same_device(const std::vector<custom::Device>& in, const custom::Param&,
                        std::vector<custom::Device>& out) {
    for (auto& o : out)
        o = in[0];
}

inline void same_format(const std::vector<custom::Format>& in, const custom::Param&,
                        std::vector<custom::Format>& out) {
    for (auto& o : out)
        o = in[0];
}

inline void float_dtype(const std::vector<custom::DType>&, const custom::Param&, std::vector<custom::DType>& out) {
    for (auto& o : out)
        o = custom::DType("float32");
}

}  // namespace dnnl_rt
}  // namespace basebn
