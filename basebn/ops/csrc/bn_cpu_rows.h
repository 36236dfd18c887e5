// The row statistics of the CPU kernels, shared by the unfused stats (bn_cpu.cpp) and the one-call training
// forward (bn_train_cpu.cpp), so both give the same bits: a row of S contiguous elements is reduced in chunks of
// kChunk (a float first pass for the chunk mean, a float second pass over the L1-resident chunk for the
// deviations), chunks merged in double with Chan's formula; the N rows of a channel then merged exactly in
// double (merge_channel_rows). float32 sums use GCC/Clang generic vectors (4 x 4 floats: four independent add
// chains, SSE on x86-64 / NEON on aarch64 with plain -O3, no -march); float16 bits take the scalar templates.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "bn_math.h"

namespace basebn {
namespace cpu {
namespace rows {

constexpr int64_t kChunk = 4096;  // elements per float partial sum (16 KB fp32)

typedef float bn_v4f __attribute__((vector_size(16)));

inline bn_v4f ld4(const float* p) {
    bn_v4f v;
    std::memcpy(&v, p, sizeof(v));
    return v;
}

inline float hsum4(bn_v4f v) {
    return (v[0] + v[1]) + (v[2] + v[3]);
}

template <typename T>
inline float span_sum(const T* q, int64_t len) {
    float a0 = 0.f, a1 = 0.f;
    int64_t i = 0;
    for (; i + 2 <= len; i += 2) {
        a0 += BnIO<T>::load(q[i]);
        a1 += BnIO<T>::load(q[i + 1]);
    }
    if (i < len)
        a0 += BnIO<T>::load(q[i]);
    return a0 + a1;
}

template <>
inline float span_sum<float>(const float* q, int64_t len) {
    bn_v4f a0 = {0.f, 0.f, 0.f, 0.f}, a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 16 <= len; i += 16) {
        a0 += ld4(q + i);
        a1 += ld4(q + i + 4);
        a2 += ld4(q + i + 8);
        a3 += ld4(q + i + 12);
    }
    float s = hsum4((a0 + a1) + (a2 + a3));
    for (; i < len; ++i)
        s += q[i];
    return s;
}

// sd = sum(q - c), sd2 = sum((q - c)^2)
template <typename T>
inline void span_dev_sums(const T* q, int64_t len, float c, float& sd, float& sd2) {
    sd = 0.f;
    sd2 = 0.f;
    for (int64_t i = 0; i < len; ++i) {
        const float d = BnIO<T>::load(q[i]) - c;
        sd += d;
        sd2 += d * d;
    }
}

template <>
inline void span_dev_sums<float>(const float* q, int64_t len, float c, float& sd, float& sd2) {
    const bn_v4f cv = {c, c, c, c};
    bn_v4f s0 = {0.f, 0.f, 0.f, 0.f}, s1 = s0, q0 = s0, q1 = s0;
    int64_t i = 0;
    for (; i + 8 <= len; i += 8) {
        const bn_v4f d0 = ld4(q + i) - cv, d1 = ld4(q + i + 4) - cv;
        s0 += d0;
        s1 += d1;
        q0 += d0 * d0;
        q1 += d1 * d1;
    }
    sd = hsum4(s0 + s1);
    sd2 = hsum4(q0 + q1);
    for (; i < len; ++i) {
        const float d = q[i] - c;
        sd += d;
        sd2 += d * d;
    }
}

template <typename T>
inline void row_moments(const T* p, int64_t S, double& mean, double& m2) {
    double n = 0.0;
    mean = 0.0;
    m2 = 0.0;
    for (int64_t off = 0; off < S; off += kChunk) {
        const int64_t len = std::min(kChunk, S - off);
        const T* q = p + off;
        const float mb = span_sum(q, len) / static_cast<float>(len);
        float sd, sd2;  // second pass over the L1-resident chunk
        span_dev_sums(q, len, mb, sd, sd2);
        double bm, bm2;
        bn_block_moments(static_cast<double>(len), mb, sd, sd2, bm, bm2);
        bn_chan_merge<double>(n, mean, m2, static_cast<double>(len), bm, bm2);
    }
}

// mean and m2 of one channel from the moments of its N rows (row n at rm[n * stride], each of S elements):
// an exact two-pass merge in double, in n order
inline void merge_channel_rows(const double* rm, const double* rm2, int64_t N, int64_t stride, int64_t S,
                               float& mean, float& m2) {
    double mu = 0.0;
    for (int64_t n = 0; n < N; ++n)
        mu += rm[n * stride];
    mu /= static_cast<double>(N);
    double within = 0.0, between = 0.0;
    for (int64_t n = 0; n < N; ++n) {
        within += rm2[n * stride];
        const double dv = rm[n * stride] - mu;
        between += dv * dv;
    }
    mean = static_cast<float>(mu);
    m2 = static_cast<float>(within + static_cast<double>(S) * between);
}

}  // namespace rows
}  // namespace cpu
}  // namespace basebn
