// The guarded running-statistics update of one BN layer in one CPU op (bn_guard.apply_running_update):
//
//   BasebnBnRunningUpdate (running_mean, running_var, mean, var, bad) -> (running_mean', running_var', bad')
//   params: keep
//
// When every value of mean and var is finite: running' = running * keep + batch * (1 - keep), each product and the
// sum rounded to float32 as MegEngine's element-wise ops round them (keep and 1 - keep are float32 scalars made
// from the double param, as MegEngine makes them from Python floats; x86-64 without -mfma contracts no FMA, so the
// bits are the fallback's; GCC on aarch64 may fuse a product and the sum, an ulp apart there). Otherwise
// running' = running, bit for bit, and bad' = bad + 1 (int32, shape (1,)).
// It replaces ~20 MegEngine ops per layer and step with one, at about a quarter of their time
// (results/running_update.json); a local layer's training op (BasebnBn[Add]ActTrainForwardUpdate, bn_ops.cpp)
// calls `update` itself, saving that one too.
#include <cmath>
#include <cstdint>
#include <vector>

#include "bn_act_kernels.h"
#include "megbrain/custom/custom.h"
#include "queued_work.h"
#include "strided_copy.h"

namespace basebn {
namespace running {

using custom::Param;
using custom::Shape;
using custom::Tensor;

void update(const Tensor& running_mean, const Tensor& running_var, const float* m, const float* v, const Tensor& bad_in,
            double keep, Tensor& running_mean_out, Tensor& running_var_out, Tensor& bad_out) {
    const size_t c = running_mean.size();
    custom_assert(running_var.size() == c, "running update: running_var has %zu values, running_mean %zu",
                  running_var.size(), c);
    custom_assert(bad_in.size() == 1, "running update: bad count must have one value, got %zu", bad_in.size());
    std::vector<float> rm(c), rv(c);
    gather_strided(running_mean, rm);
    gather_strided(running_var, rv);
    bool ok = true;
    for (size_t i = 0; i < c; ++i)
        ok = ok && std::isfinite(m[i]) && std::isfinite(v[i]);
    const float k = static_cast<float>(keep), k1 = static_cast<float>(1.0 - keep);
    float* out_m = running_mean_out.data<float>();
    float* out_v = running_var_out.data<float>();
    for (size_t i = 0; i < c; ++i) {
        if (ok) {
            const float a = rm[i] * k, b = m[i] * k1;
            const float p = rv[i] * k, q = v[i] * k1;
            out_m[i] = a + b;
            out_v[i] = p + q;
        } else {
            out_m[i] = rm[i];
            out_v[i] = rv[i];
        }
    }
    std::vector<int32_t> bad(1);
    gather_strided(bad_in, bad);
    bad_out.data<int32_t>()[0] = bad[0] + (ok ? 0 : 1);
}

void compute(const std::vector<Tensor>& in, const Param& params, std::vector<Tensor>& out) {
    wait_for_queued_work();
    const size_t c = in[0].size();
    for (int i = 2; i < 4; ++i) {
        custom_assert(in[i].size() == c, "running update: input %d has %zu values, running_mean %zu", i,
                      in[i].size(), c);
    }
    std::vector<float> m(c), v(c);
    gather_strided(in[2], m);
    gather_strided(in[3], v);
    update(in[0], in[1], m.data(), v.data(), in[4], params["keep"].as<double>(), out[0], out[1], out[2]);
}

void shape_infer(const std::vector<Shape>& in, const Param&, std::vector<Shape>& out) {
    out[0] = in[0];
    out[1] = in[1];
    out[2] = Shape({1});
}

void dtype_infer(const std::vector<custom::DType>&, const Param&, std::vector<custom::DType>& out) {
    out[0] = custom::DType("float32");
    out[1] = custom::DType("float32");
    out[2] = custom::DType("int32");
}

void device_infer(const std::vector<custom::Device>& in, const Param&, std::vector<custom::Device>& out) {
    out.assign(out.size(), in[0]);
}

void format_infer(const std::vector<custom::Format>& in, const Param&, std::vector<custom::Format>& out) {
    out.assign(out.size(), in[0]);
}

}  // namespace running
}  // namespace basebn

CUSTOM_OP_REG_BEGIN(BasebnBnRunning)

CUSTOM_OP_REG(BasebnBnRunningUpdate)
        .set_description("basebn: running statistics moved by a finite batch, or kept and the batch counted")
        .add_input("running_mean", {"float32"})
        .add_input("running_var", {"float32"})
        .add_input("mean", {"float32"})
        .add_input("var", {"float32"})
        .add_input("bad", {"int32"})
        .add_output("running_mean_out", {"float32"})
        .add_output("running_var_out", {"float32"})
        .add_output("bad_out", {"int32"})
        .add_param("keep", 0.9)
        .set_shape_infer(basebn::running::shape_infer)
        .set_dtype_infer(basebn::running::dtype_infer)
        .set_device_infer(basebn::running::device_infer)
        .set_format_infer(basebn::running::format_infer)
        .set_compute("x86", basebn::running::compute);

CUSTOM_OP_REG_END(BasebnBnRunning)
