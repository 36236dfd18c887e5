// Per-element BatchNorm math shared by the CPU (bn_cpu.cpp) and CUDA (bn_cuda.cu) kernels.
//
// Conventions: x, dy are (N, C, S) with S = prod(spatial dims); per-channel vectors are float32.
//   stats:            mean = sum(x) / cnt,  m2 = sum((x - mean)^2)
//   normalize:        y  = (x - mean) * (invstd * w) + b
//   backward reduce:  sum_dy = sum(dy),  sum_dy_xhat = invstd * sum(dy * (x - mean))
//   backward elemt:   dx = w * invstd * (dy - sum_dy / count - (x - mean) * invstd * sum_dy_xhat / count)
// Subtracting the mean before scaling (instead of x * scale + shift) keeps full float32 precision
// when |mean| >> std.
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#define BN_HD __host__ __device__ __forceinline__
#else
#define BN_HD inline
#endif

namespace basebn {

// ------------------------------------------------------------------ float16 <-> float32
// float16 travels as its raw 16 bits (custom::float16_t is uint16_t).
BN_HD uint32_t bn_f2u(float f) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
#endif
}

BN_HD float bn_u2f(uint32_t u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
#endif
}

BN_HD float bn_half_to_float(uint16_t h) {
#if defined(__CUDA_ARCH__)
    return __half2float(__ushort_as_half(h));
#else
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    const uint32_t mant = h & 0x3ffu;
    if (exp == 0) {  // zero or subnormal: mant * 2^-24
        const float v = (float)mant * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    if (exp == 31)  // inf / nan
        return bn_u2f(sign | 0x7f800000u | (mant << 13));
    return bn_u2f(sign | ((exp + 112u) << 23) | (mant << 13));
#endif
}

// round to nearest even, overflow to inf, nan preserved
BN_HD uint16_t bn_float_to_half(float x) {
#if defined(__CUDA_ARCH__)
    return __half_as_ushort(__float2half_rn(x));
#else
    const uint32_t f32_inf = 255u << 23;
    const uint32_t f16_max = (127u + 16u) << 23;                        // 2^16
    const uint32_t denorm_magic = ((127u - 15u) + (23u - 10u) + 1u) << 23;  // bits of 0.5f
    uint32_t f = bn_f2u(x);
    const uint32_t sign = f & 0x80000000u;
    f ^= sign;
    uint32_t o;
    if (f >= f16_max) {
        o = (f > f32_inf) ? 0x7e00u : 0x7c00u;
    } else if (f < (113u << 23)) {  // result is subnormal or zero: let the FPU round
        o = bn_f2u(bn_u2f(f) + bn_u2f(denorm_magic)) - denorm_magic;
    } else {
        const uint32_t mant_odd = (f >> 13) & 1u;
        f += 0xc8000fffu;  // rebias exponent by (15 - 127) << 23 (mod 2^32), add rounding bias
        f += mant_odd;
        o = f >> 13;
    }
    return (uint16_t)(o | (sign >> 16));
#endif
}

template <typename T>
struct BnIO;

template <>
struct BnIO<float> {
    static BN_HD float load(float v) { return v; }
    static BN_HD float store(float v) { return v; }
};

template <>
struct BnIO<uint16_t> {
    static BN_HD float load(uint16_t v) { return bn_half_to_float(v); }
    static BN_HD uint16_t store(float v) { return bn_float_to_half(v); }
};

// ------------------------------------------------------------------ moments (Chan et al.)
// Merge block moments (nb, mean_b, m2_b) into (n, mean, m2). Acc = float or double.
template <typename Acc>
BN_HD void bn_chan_merge(Acc& n, Acc& mean, Acc& m2, Acc nb, Acc mean_b, Acc m2_b) {
    if (nb <= Acc(0))
        return;
    const Acc nt = n + nb;
    const Acc delta = mean_b - mean;
    const Acc fb = nb / nt;
    mean += delta * fb;
    m2 += m2_b + delta * delta * n * fb;
    n = nt;
}

// Welford update with one sample.
template <typename Acc>
BN_HD void bn_welford_add(Acc& n, Acc& mean, Acc& m2, Acc v) {
    n += Acc(1);
    const Acc d = v - mean;
    mean += d / n;
    m2 += d * (v - mean);
}

// Compensated two-pass block result: given a provisional block mean mb (from a first pass) and
// sd = sum(x - mb), sd2 = sum((x - mb)^2) over cnt elements, the exact block mean / M2.
BN_HD void bn_block_moments(
        double cnt, double mb, double sd, double sd2, double& mean, double& m2) {
    mean = mb + sd / cnt;
    m2 = sd2 - sd * sd / cnt;
    if (m2 < 0.0)
        m2 = 0.0;
}

// ------------------------------------------------------------------ per-channel coefficients
// normalize: y = (x - mean) * scale + bias
BN_HD float bn_norm_scale(float invstd, float w) {
    return invstd * w;
}

BN_HD float bn_normalize_elem(float x, float mean, float scale, float bias) {
    return (x - mean) * scale + bias;
}

// backward elemt: dx = a * (dy - mdy - (x - mean) * k)
struct BnElemtCoef {
    float a;    // w * invstd
    float mdy;  // sum_dy / count
    float k;    // invstd * sum_dy_xhat / count
};

BN_HD BnElemtCoef bn_elemt_coef(
        float invstd, float w, float sum_dy, float sum_dy_xhat, double inv_count) {
    BnElemtCoef c;
    c.a = w * invstd;
    c.mdy = (float)((double)sum_dy * inv_count);
    c.k = (float)((double)invstd * (double)sum_dy_xhat * inv_count);
    return c;
}

BN_HD float bn_elemt_elem(float dy, float x, float mean, const BnElemtCoef& c) {
    return c.a * (dy - c.mdy - (x - mean) * c.k);
}

// ------------------------------------------------------------------ strided layouts
// A (N, C, spatial...) layout with element strides, up to 5 dims. For a contiguous tensor
// offset(n, c, s) = (n * C + c) * S + s.
struct BnLayout {
    int ndim;
    int64_t shape[5];
    int64_t stride[5];
};

BN_HD int64_t bn_offset(const BnLayout& L, int64_t n, int64_t c, int64_t s) {
    int64_t off = n * L.stride[0] + c * L.stride[1];
    for (int d = L.ndim - 1; d >= 2; --d) {
        const int64_t len = L.shape[d];
        off += (s % len) * L.stride[d];
        s /= len;
    }
    return off;
}

// ------------------------------------------------------------------ fused activations
// BN -> activation (bn_act_cpu.cpp, the CUDA act kernels): y = act(pre), pre = bn(x) [+ shortcut].
// The backward's act' comes from one element-wise value v (bn_act_from_pre):
//   ReLU, ReLU6: v = the forward's OUTPUT y (ReLU: y > 0; ReLU6: 0 < y < 6): the pre-activation is never kept;
//   SiLU, HSwish: v = pre itself, which y does not determine; the backward recomputes it from x, the saved
//     per-channel mean / invstd and the affine (bn_normalize_elem, as the forward). No residual form for these.
//   identity: reads nothing.
// Codes: ACT_CODES in basebn/ops/bn_ops/kernel.py.
enum BnAct { kBnActIdentity = 0, kBnActRelu = 1, kBnActRelu6 = 2, kBnActSilu = 3, kBnActHswish = 4 };

// act' needs the pre-activation (recomputed from x) rather than the output y
BN_HD constexpr bool bn_act_from_pre(int act) {
    return act == kBnActSilu || act == kBnActHswish;
}

// exp(v): expf on the device. On the host a branch-free expf that `omp simd` loops vectorise (glibc's vector
// expf needs -ffast-math, which the build does not use): v = n ln2 + r, |r| <= ln2 / 2, e^r by Cephes' expf
// polynomial, 2^n through the exponent bits; within 1 ulp of e^v for v in [-87.33, 88.37]. Outside, v is clamped
// to that range (e^v saturates at FLT_MIN and 2.4e38; SiLU only adds it to 1); NaN gives NaN.
BN_HD float bn_expf(float v) {
#if defined(__CUDA_ARCH__)
    return expf(v);
#else
    float c = v < 88.3762626647949f ? v : 88.3762626647949f;
    c = c > -87.3365447505531f ? c : -87.3365447505531f;
    const float fn = (c * 1.44269504088896341f + 12582912.f) - 12582912.f;  // round to nearest (1.5 * 2^23)
    const float r = (c - fn * 0.693359375f) - fn * -2.12194440e-4f;       // ln2 in two parts
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.f;
    const float e = p * bn_u2f((uint32_t)((int32_t)fn + 127) << 23);
    return v == v ? e : v;
#endif
}

// SiLU: pre * sigmoid(pre) = pre / (1 + exp(-pre))
// HSwish: pre * relu6(pre + 3) / 6 (MegEngine's F.hswish)
template <int Act>
BN_HD float bn_act_apply(float v) {
    if (Act == kBnActRelu)
        return v > 0.f ? v : 0.f;
    if (Act == kBnActRelu6)
        return v > 0.f ? (v < 6.f ? v : 6.f) : 0.f;
    if (Act == kBnActSilu)
        return v / (1.f + bn_expf(-v));
    if (Act == kBnActHswish) {
        const float r = v + 3.f;
        return v * (r > 0.f ? (r < 6.f ? r : 6.f) : 0.f) / 6.f;
    }
    return v;
}

// dy * act'(pre), with v = y = act(pre) or v = pre (bn_act_from_pre). Where act' = 0 on a whole interval
// (ReLU, ReLU6, HSwish below -3) the result is exactly 0, even for a non-finite dy.
// SiLU': s * (1 + pre * (1 - s)), s = sigmoid(pre).
// HSwish': 0 below -3, 1 above 3, (2 pre + 3) / 6 on [-3, 3] -- at the kinks themselves the inner formula
// (-0.5 at -3, 1.5 at 3), as MegEngine's F.hswish gradient.
template <int Act>
BN_HD float bn_act_grad(float dy, float v) {
    if (Act == kBnActRelu)
        return v > 0.f ? dy : 0.f;
    if (Act == kBnActRelu6)
        return (v > 0.f && v < 6.f) ? dy : 0.f;
    if (Act == kBnActSilu) {
        const float s = 1.f / (1.f + bn_expf(-v));
        return dy * (s * (1.f + v * (1.f - s)));
    }
    if (Act == kBnActHswish)
        return v < -3.f ? 0.f : (v > 3.f ? dy : dy * (2.f * v + 3.f) / 6.f);
    return dy;
}

}  // namespace basebn
