// The oneDNN CPU engine and the OpenMP thread count of a call, shared by the oneDNN ops (conv_dnnl.cpp,
// pool_dnnl.cpp): one engine for the library, and the same thread rule everywhere.
// Compiled only with -DBASEBN_WITH_DNNL.
#pragma once

#include <omp.h>

#include <cstdlib>

#include <oneapi/dnnl/dnnl.hpp>

namespace basebn {
namespace dnnl_rt {

// The CPU engine (one per process: inline, so every translation unit shares it).
inline dnnl::engine& engine() {
    static dnnl::engine e(dnnl::engine::kind::cpu, 0);
    return e;
}

// Threads for this call: $BASEBN_NUM_THREADS, else the OpenMP default seen on the first call. Sets it as the
// calling thread's OpenMP default (oneDNN's primitives and the ops' own parallel loops use it) and returns it.
inline int set_threads() {
    static const int default_threads = omp_get_max_threads();
    int n = default_threads;
    if (const char* env = std::getenv("BASEBN_NUM_THREADS")) {
        const int v = std::atoi(env);
        if (v > 0)
            n = v;
    }
    omp_set_num_threads(n);
    return n;
}

}  // namespace dnnl_rt
}  // namespace basebn
