// Matrix product custom op for CPU training: a Linear layer's forward and both of its gradients.
//
//   BasebnMatMul (a, b, bias) -> (c)    c = op(a) op(b) [+ bias on every row]; op(t) = t or t^T
//
// Params: trans_a, trans_b (op), has_bias (else the bias input is a placeholder and is not read).
// a is (M, K), or (K, M) with trans_a; b is (K, N), or (N, K) with trans_b; bias holds N values; c is (M, N).
// A Linear layer uses it three times: y = x W^T + b, dx = dy W, dW = dy^T x. MegEngine 1.13's CPU MatrixMul runs
// on one thread; this op's oneDNN sgemm is ~2.6x faster on MobileNetV2's classifier at 1 thread (results/linear.json).
// Threads: $BASEBN_NUM_THREADS, else the OpenMP default (dnnl_runtime.h); a fixed thread count gives the same bits
// every call.
// Non-contiguous inputs are gathered first. Compiled only with -DBASEBN_WITH_DNNL.
#ifdef BASEBN_WITH_DNNL

#include <algorithm>
#include <cstdint>
#include <vector>

#include <oneapi/dnnl/dnnl.h>

#include "dnnl_runtime.h"
#include "megbrain/custom/custom.h"
#include "queued_work.h"

namespace basebn {
namespace matmul {

using custom::Param;
using custom::Shape;
using custom::Tensor;
using dim = int64_t;

// The sizes of one product: c (M, N) = op(a) (M, K) op(b) (K, N).
struct Geom {
    dim M, N, K;
    bool trans_a, trans_b, bias;
};

Geom geometry(const Shape& a, const Shape& b, const Param& p) {
    custom_assert(a.ndim() == 2 && b.ndim() == 2, "matmul: a and b must be 2-D, got %zu and %zu dims", a.ndim(),
                  b.ndim());
    Geom g{};
    g.trans_a = p["trans_a"].as<bool>(), g.trans_b = p["trans_b"].as<bool>(), g.bias = p["has_bias"].as<bool>();
    g.M = g.trans_a ? a[1] : a[0];
    g.K = g.trans_a ? a[0] : a[1];
    const dim kb = g.trans_b ? b[1] : b[0];
    g.N = g.trans_b ? b[0] : b[1];
    custom_assert(kb == g.K, "matmul: inner sizes differ (%lld vs %lld)", static_cast<long long>(g.K),
                  static_cast<long long>(kb));
    return g;
}

const float* contiguous(const Tensor& t, std::vector<float>& buf) {
    return dnnl_rt::contiguous_f32(t, buf, "matmul");
}

void compute(const std::vector<Tensor>& in, const Param& p, std::vector<Tensor>& out) {
    wait_for_queued_work();
    const Geom g = geometry(in[0].shape(), in[1].shape(), p);
    Tensor& c = out[0];
    custom_assert(c.is_contiguous() || c.size() == 0, "matmul: output tensor is not contiguous");
    if (g.M == 0 || g.N == 0)
        return;
    float* cp = c.data<float>();
    if (g.bias) {  // c starts as the bias on every row, and sgemm adds to it (beta = 1)
        custom_assert(static_cast<dim>(in[2].size()) == g.N, "matmul: bias has %zu values, expected %lld",
                      in[2].size(), static_cast<long long>(g.N));
        std::vector<float> bbias;
        const float* bias = contiguous(in[2], bbias);
        for (dim m = 0; m < g.M; ++m)
            std::copy(bias, bias + g.N, cp + m * g.N);
    } else if (g.K == 0) {  // an empty sum: sgemm is not called
        std::fill(cp, cp + g.M * g.N, 0.f);
    }
    if (g.K == 0)
        return;
    std::vector<float> ba, bb;
    const float* a = contiguous(in[0], ba);
    const float* b = contiguous(in[1], bb);
    dnnl_rt::set_threads();
    // row-major: lda / ldb are the stored rows' lengths
    const dnnl_status_t st = dnnl_sgemm(g.trans_a ? 'T' : 'N', g.trans_b ? 'T' : 'N', g.M, g.N, g.K, 1.f, a,
                                        g.trans_a ? g.M : g.K, b, g.trans_b ? g.K : g.N, g.bias ? 1.f : 0.f, cp, g.N);
    custom_assert(st == dnnl_success, "matmul: oneDNN sgemm failed (status %d)", static_cast<int>(st));
}

void shape(const std::vector<Shape>& in, const Param& p, std::vector<Shape>& out) {
    const Geom g = geometry(in[0], in[1], p);
    out[0] = Shape({size_t(g.M), size_t(g.N)});
}

}  // namespace matmul
}  // namespace basebn

CUSTOM_OP_REG_BEGIN(BasebnMatMul)

CUSTOM_OP_REG(BasebnMatMul)
        .set_description("basebn: oneDNN sgemm, c = op(a) op(b) [+ bias per row], op = identity or transpose")
        .add_input("a", {"float32"})
        .add_input("b", {"float32"})
        .add_input("bias", {"float32"})
        .add_output("c", {"float32"})
        .add_param("trans_a", false)
        .add_param("trans_b", false)
        .add_param("has_bias", false)
        .set_device_infer(basebn::dnnl_rt::same_device)
        .set_format_infer(basebn::dnnl_rt::same_format)
        .set_shape_infer(basebn::matmul::shape)
        .set_dtype_infer(basebn::dnnl_rt::float_dtype)
        .set_compute("x86", basebn::matmul::compute);

CUSTOM_OP_REG_END(BasebnMatMul)

#endif  // BASEBN_WITH_DNNL
