// $BASEBN_NUM_THREADS as every CPU op reads it (bn_cpu.cpp, bn_act_cpu_rows.h, dnnl_runtime.h): one rule, one bound.
#pragma once

#include <cerrno>
#include <cstdlib>

namespace basebn {

// The most threads an op asks for: basebn/utils/cli_args.py's MAX_THREADS, which the CLIs check the variable against
// (basebn/utils/env_vars.py; tests/utils/test_env_vars.py compares the two).
constexpr long kMaxEnvThreads = 1024;

// $BASEBN_NUM_THREADS when it is a whole number in [1, kMaxEnvThreads], else 0: the caller then takes OpenMP's
// default. A library user's 100000 would otherwise ask OpenMP for 100000 threads (a segmentation fault).
inline int env_threads() {
    const char* env = std::getenv("BASEBN_NUM_THREADS");
    if (env == nullptr)
        return 0;
    char* end = nullptr;
    errno = 0;
    const long v = std::strtol(env, &end, 10);
    if (end == env || *end != '\0' || errno != 0 || v < 1 || v > kMaxEnvThreads)
        return 0;
    return static_cast<int>(v);
}

}  // namespace basebn
