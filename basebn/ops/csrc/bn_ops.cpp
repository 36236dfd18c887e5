// Registration of the basebn BatchNorm custom ops (MegEngine custom-op API).
//
//   BasebnBnStats          (x)                                        -> (mean, m2)
//   BasebnBnNormalize      (x, mean, invstd, weight, bias)            -> (y)
//   BasebnBnBackwardReduce (dy, x, mean, invstd)                      -> (sum_dy, sum_dy_xhat)
//   BasebnBnBackwardElemt  (dy, x, mean, invstd, weight, sum_dy, sum_dy_xhat) -> (dx)
//
// Optional inputs (weight, bias) always occupy their slot; params has_weight / has_bias say
// whether the slot holds real data (the Python side passes a placeholder otherwise).
// Param force_strided makes the CPU kernels take the non-contiguous gather path (for tests).
// The CUDA computes are registered only when compiled with -DBASEBN_WITH_CUDA (bn_cuda.cu linked).
#include "bn_kernels.h"

CUSTOM_OP_REG_BEGIN(BasebnBN)

namespace {

void same_device(
        const std::vector<Device>& inputs, const Param&, std::vector<Device>& outputs) {
    for (auto& o : outputs)
        o = inputs[0];
}

void same_format(
        const std::vector<Format>& inputs, const Param&, std::vector<Format>& outputs) {
    for (auto& o : outputs)
        o = inputs[0];
}

// ---- per-channel outputs (C,) float32; C is dim 1 of input 0 (x, or dy)
void stats_shape(
        const std::vector<Shape>& inputs, const Param&, std::vector<Shape>& outputs) {
    for (auto& o : outputs)
        o = Shape({inputs[0][1]});
}

void float_dtype(const std::vector<DType>&, const Param&, std::vector<DType>& outputs) {
    for (auto& o : outputs)
        o = DType("float32");
}

// ---- element-wise outputs: shape and dtype of input 0
void like_input0_shape(
        const std::vector<Shape>& inputs, const Param&, std::vector<Shape>& outputs) {
    outputs[0] = inputs[0];
}

void like_input0_dtype(
        const std::vector<DType>& inputs, const Param&, std::vector<DType>& outputs) {
    outputs[0] = inputs[0];
}

#define BASEBN_COMPUTES(NS)                                                               \
    void NS##_stats(                                                                      \
            const std::vector<Tensor>& in, const Param& p, std::vector<Tensor>& out) {    \
        basebn::NS::stats(in[0], out[0], out[1], p["force_strided"].as<bool>());         \
    }                                                                                     \
    void NS##_normalize(                                                                  \
            const std::vector<Tensor>& in, const Param& p, std::vector<Tensor>& out) {    \
        basebn::NS::normalize(                                                            \
                in[0], in[1], in[2], p["has_weight"].as<bool>() ? &in[3] : nullptr,       \
                p["has_bias"].as<bool>() ? &in[4] : nullptr, out[0],                      \
                p["force_strided"].as<bool>());                                           \
    }                                                                                     \
    void NS##_backward_reduce(                                                            \
            const std::vector<Tensor>& in, const Param& p, std::vector<Tensor>& out) {    \
        basebn::NS::backward_reduce(                                                      \
                in[0], in[1], in[2], in[3], out[0], out[1], p["force_strided"].as<bool>()); \
    }                                                                                     \
    void NS##_backward_elemt(                                                             \
            const std::vector<Tensor>& in, const Param& p, std::vector<Tensor>& out) {    \
        basebn::NS::backward_elemt(                                                       \
                in[0], in[1], in[2], in[3], p["has_weight"].as<bool>() ? &in[4] : nullptr, \
                in[5], in[6], p["count"].as<double>(), out[0],                            \
                p["force_strided"].as<bool>());                                           \
    }

BASEBN_COMPUTES(cpu)
#ifdef BASEBN_WITH_CUDA
BASEBN_COMPUTES(cuda)
#define BASEBN_CUDA_COMPUTE(fn) .set_compute("cuda", cuda_##fn)
#else
#define BASEBN_CUDA_COMPUTE(fn)
#endif

}  // namespace

#define BASEBN_FLOATS {"float32", "float16"}

CUSTOM_OP_REG(BasebnBnStats)
        .set_description("basebn: per-channel mean and M2 (sum of squared deviations)")
        .add_input("x", BASEBN_FLOATS)
        .add_output("mean", {"float32"})
        .add_output("m2", {"float32"})
        .add_param("force_strided", false)
        .set_device_infer(same_device)
        .set_format_infer(same_format)
        .set_shape_infer(stats_shape)
        .set_dtype_infer(float_dtype)
        .set_compute("x86", cpu_stats) BASEBN_CUDA_COMPUTE(stats);

CUSTOM_OP_REG(BasebnBnNormalize)
        .set_description("basebn: y = (x - mean) * invstd * weight + bias")
        .add_input("x", BASEBN_FLOATS)
        .add_input("mean", {"float32"})
        .add_input("invstd", {"float32"})
        .add_input("weight", {"float32"})
        .add_input("bias", {"float32"})
        .add_output("y", BASEBN_FLOATS)
        .add_param("has_weight", false)
        .add_param("has_bias", false)
        .add_param("force_strided", false)
        .set_device_infer(same_device)
        .set_format_infer(same_format)
        .set_shape_infer(like_input0_shape)
        .set_dtype_infer(like_input0_dtype)
        .set_compute("x86", cpu_normalize) BASEBN_CUDA_COMPUTE(normalize);

CUSTOM_OP_REG(BasebnBnBackwardReduce)
        .set_description("basebn: per-channel sum(dy), sum(dy * xhat)")
        .add_input("dy", BASEBN_FLOATS)
        .add_input("x", BASEBN_FLOATS)
        .add_input("mean", {"float32"})
        .add_input("invstd", {"float32"})
        .add_output("sum_dy", {"float32"})
        .add_output("sum_dy_xhat", {"float32"})
        .add_param("force_strided", false)
        .set_device_infer(same_device)
        .set_format_infer(same_format)
        .set_shape_infer(stats_shape)
        .set_dtype_infer(float_dtype)
        .set_compute("x86", cpu_backward_reduce) BASEBN_CUDA_COMPUTE(backward_reduce);

CUSTOM_OP_REG(BasebnBnBackwardElemt)
        .set_description(
                "basebn: dx = w * invstd * (dy - sum_dy / count - xhat * sum_dy_xhat / count)")
        .add_input("dy", BASEBN_FLOATS)
        .add_input("x", BASEBN_FLOATS)
        .add_input("mean", {"float32"})
        .add_input("invstd", {"float32"})
        .add_input("weight", {"float32"})
        .add_input("sum_dy", {"float32"})
        .add_input("sum_dy_xhat", {"float32"})
        .add_output("dx", BASEBN_FLOATS)
        .add_param("has_weight", false)
        .add_param("count", 1.0)
        .add_param("force_strided", false)
        .set_device_infer(same_device)
        .set_format_infer(same_format)
        .set_shape_infer(like_input0_shape)
        .set_dtype_infer(like_input0_dtype)
        .set_compute("x86", cpu_backward_elemt) BASEBN_CUDA_COMPUTE(backward_elemt);

CUSTOM_OP_REG_END(BasebnBN)

// ---- fused BN -> activation ops (bn_act_kernels.h; kernels in bn_act_cpu.cpp and the CUDA act kernels).
// Statistics come from BasebnBnStats (or SyncBN's collective); these replace the element-wise passes.
//   BasebnBnActNormalize        (x, mean, invstd, weight, bias)                       -> (y)
//   BasebnBnAddActNormalize     (x, shortcut, mean, invstd, weight, bias)             -> (y)
//   BasebnBnActBackwardReduce   (dy, y, x, mean, invstd, weight, bias)                      -> (sum_dz, sum_dz_xhat)
//   BasebnBnActBackwardElemt    (dy, y, x, mean, invstd, weight, bias, sum_dz, sum_dz_xhat) -> (dx)
//   BasebnBnAddActBackwardElemt (dy, y, x, mean, invstd, weight, bias, sum_dz, sum_dz_xhat) -> (dx, dshortcut)
// Param act: a BnAct code (bn_math.h). The backward reads y = act(bn(x) [+ shortcut]) for ReLU / ReLU6's
// derivative; for SiLU / HSwish it recomputes the pre-activation from x, mean, invstd, weight and bias instead
// (y's slot then holds a placeholder, as do weight / bias when has_weight / has_bias are false).
#include "bn_act_kernels.h"

CUSTOM_OP_REG_BEGIN(BasebnBN)

namespace {

// every output takes input 0's shape / dtype (Info = Shape or DType)
template <typename Info>
void all_like_input0(const std::vector<Info>& inputs, const Param&, std::vector<Info>& outputs) {
    outputs.assign(outputs.size(), inputs[0]);
}

#define BASEBN_ACT_COMPUTES(NS)                                                                 \
    void NS##_act_normalize(                                                                    \
            const std::vector<Tensor>& in, const Param& p, std::vector<Tensor>& out) {          \
        basebn::NS::act_normalize(                                                              \
                in[0], nullptr, in[1], in[2], p["has_weight"].as<bool>() ? &in[3] : nullptr,    \
                p["has_bias"].as<bool>() ? &in[4] : nullptr, p["act"].as<int32_t>(), out[0],    \
                p["force_strided"].as<bool>());                                                 \
    }                                                                                           \
    void NS##_add_act_normalize(                                                                \
            const std::vector<Tensor>& in, const Param& p, std::vector<Tensor>& out) {          \
        basebn::NS::act_normalize(                                                              \
                in[0], &in[1], in[2], in[3], p["has_weight"].as<bool>() ? &in[4] : nullptr,     \
                p["has_bias"].as<bool>() ? &in[5] : nullptr, p["act"].as<int32_t>(), out[0],    \
                p["force_strided"].as<bool>());                                                 \
    }                                                                                           \
    void NS##_act_backward_reduce(                                                              \
            const std::vector<Tensor>& in, const Param& p, std::vector<Tensor>& out) {          \
        basebn::NS::act_backward_reduce(                                                        \
                in[0], in[1], in[2], in[3], in[4], p["has_weight"].as<bool>() ? &in[5] : nullptr, \
                p["has_bias"].as<bool>() ? &in[6] : nullptr, p["act"].as<int32_t>(), out[0],    \
                out[1], p["force_strided"].as<bool>());                                         \
    }                                                                                           \
    void NS##_act_backward_elemt(                                                               \
            const std::vector<Tensor>& in, const Param& p, std::vector<Tensor>& out) {          \
        basebn::NS::act_backward_elemt(                                                         \
                in[0], in[1], in[2], in[3], in[4], p["has_weight"].as<bool>() ? &in[5] : nullptr, \
                p["has_bias"].as<bool>() ? &in[6] : nullptr, in[7], in[8], p["count"].as<double>(), \
                p["act"].as<int32_t>(), out[0], out.size() > 1 ? &out[1] : nullptr,             \
                p["force_strided"].as<bool>());                                                 \
    }

BASEBN_ACT_COMPUTES(cpu)
#ifdef BASEBN_WITH_CUDA
BASEBN_ACT_COMPUTES(cuda)
#endif

}  // namespace

// the two normalize ops after their element-wise inputs (x, or x and shortcut)
#define BASEBN_ACT_NORMALIZE_REST                       \
    .add_input("mean", {"float32"})                     \
            .add_input("invstd", {"float32"})           \
            .add_input("weight", {"float32"})           \
            .add_input("bias", {"float32"})             \
            .add_output("y", BASEBN_FLOATS)             \
            .add_param("has_weight", false)             \
            .add_param("has_bias", false)               \
            .add_param("act", 0)                        \
            .add_param("force_strided", false)          \
            .set_device_infer(same_device)              \
            .set_format_infer(same_format)              \
            .set_shape_infer(like_input0_shape)         \
            .set_dtype_infer(like_input0_dtype)

CUSTOM_OP_REG(BasebnBnActNormalize)
        .set_description("basebn: y = act((x - mean) * invstd * weight + bias)")
        .add_input("x", BASEBN_FLOATS)
        BASEBN_ACT_NORMALIZE_REST
        .set_compute("x86", cpu_act_normalize) BASEBN_CUDA_COMPUTE(act_normalize);

CUSTOM_OP_REG(BasebnBnAddActNormalize)
        .set_description("basebn: y = act((x - mean) * invstd * weight + bias + shortcut)")
        .add_input("x", BASEBN_FLOATS)
        .add_input("shortcut", BASEBN_FLOATS)
        BASEBN_ACT_NORMALIZE_REST
        .set_compute("x86", cpu_add_act_normalize) BASEBN_CUDA_COMPUTE(add_act_normalize);

CUSTOM_OP_REG(BasebnBnActBackwardReduce)
        .set_description("basebn: dz = act'(pre) * dy; per-channel sum(dz), sum(dz * xhat)")
        .add_input("dy", BASEBN_FLOATS)
        .add_input("y", BASEBN_FLOATS)
        .add_input("x", BASEBN_FLOATS)
        .add_input("mean", {"float32"})
        .add_input("invstd", {"float32"})
        .add_input("weight", {"float32"})
        .add_input("bias", {"float32"})
        .add_output("sum_dz", {"float32"})
        .add_output("sum_dz_xhat", {"float32"})
        .add_param("has_weight", false)
        .add_param("has_bias", false)
        .add_param("act", 0)
        .add_param("force_strided", false)
        .set_device_infer(same_device)
        .set_format_infer(same_format)
        .set_shape_infer(stats_shape)
        .set_dtype_infer(float_dtype)
        .set_compute("x86", cpu_act_backward_reduce) BASEBN_CUDA_COMPUTE(act_backward_reduce);

// the two backward-elemt ops: inputs, then (after their outputs) params and infers
#define BASEBN_ACT_ELEMT_INPUTS                \
    .add_input("dy", BASEBN_FLOATS)            \
            .add_input("y", BASEBN_FLOATS)     \
            .add_input("x", BASEBN_FLOATS)     \
            .add_input("mean", {"float32"})    \
            .add_input("invstd", {"float32"})  \
            .add_input("weight", {"float32"})  \
            .add_input("bias", {"float32"})    \
            .add_input("sum_dz", {"float32"})  \
            .add_input("sum_dz_xhat", {"float32"})
#define BASEBN_ACT_ELEMT_REST                               \
    .add_param("has_weight", false)                         \
            .add_param("has_bias", false)                   \
            .add_param("count", 1.0)                        \
            .add_param("act", 0)                            \
            .add_param("force_strided", false)              \
            .set_device_infer(same_device)                  \
            .set_format_infer(same_format)                  \
            .set_shape_infer(all_like_input0<Shape>)        \
            .set_dtype_infer(all_like_input0<DType>)        \
            .set_compute("x86", cpu_act_backward_elemt) BASEBN_CUDA_COMPUTE(act_backward_elemt)

CUSTOM_OP_REG(BasebnBnActBackwardElemt)
        .set_description("basebn: dz = act'(pre) * dy; dx = w * invstd * (dz - mean(dz) - xhat * mean(dz * xhat))")
        BASEBN_ACT_ELEMT_INPUTS
        .add_output("dx", BASEBN_FLOATS)
        BASEBN_ACT_ELEMT_REST;

CUSTOM_OP_REG(BasebnBnAddActBackwardElemt)
        .set_description("basebn: BasebnBnActBackwardElemt, and dshortcut = dz from the same pass")
        BASEBN_ACT_ELEMT_INPUTS
        .add_output("dx", BASEBN_FLOATS)
        .add_output("dshortcut", BASEBN_FLOATS)
        BASEBN_ACT_ELEMT_REST;

#undef BASEBN_ACT_NORMALIZE_REST
#undef BASEBN_ACT_ELEMT_INPUTS
#undef BASEBN_ACT_ELEMT_REST

CUSTOM_OP_REG_END(BasebnBN)

// ---- one-call local training passes (bn_act_kernels.h; bn_train_cpu.cpp), CPU only: BN -> act [+ shortcut]
// with batch statistics, for BN without SyncBN (the Python side uses the ops above on GPU and under SyncBN).
//   BasebnBnActTrainForward     (x, weight, bias)                        -> (y, mean, m2, invstd)
//   BasebnBnAddActTrainForward  (x, shortcut, weight, bias)              -> (y, mean, m2, invstd)
//   BasebnBnActTrainBackward    (dy, y, x, mean, invstd, weight, bias)   -> (dx, sum_dz, sum_dz_xhat)
//   BasebnBnAddActTrainBackward (dy, y, x, mean, invstd, weight, bias)   -> (dx, dshortcut, sum_dz, sum_dz_xhat)
//   BasebnBn[Add]ActTrainForwardUpdate: the forward, + inputs (running_mean, running_var, bad), + their new values
//                                       as outputs, + param keep (bn_guard's guarded update, in the same call)
// Params as the act ops, and eps (forward). Per-channel inputs hold C values in any shape; the backward's sums take
// the weight slot's shape.
CUSTOM_OP_REG_BEGIN(BasebnBN)

namespace {

// outputs [0, Like) take input 0's shape / dtype, the others are per-channel float32 (C,)
template <int Like>
void like_x_then_channels_shape(const std::vector<Shape>& inputs, const Param&, std::vector<Shape>& outputs) {
    for (size_t i = 0; i < outputs.size(); ++i)
        outputs[i] = static_cast<int>(i) < Like ? inputs[0] : Shape({inputs[0][1]});
}

template <int Like>
void like_x_then_channels_dtype(const std::vector<DType>& inputs, const Param&, std::vector<DType>& outputs) {
    for (size_t i = 0; i < outputs.size(); ++i)
        outputs[i] = static_cast<int>(i) < Like ? inputs[0] : DType("float32");
}

// outputs [0, Like) take input 0's shape, the per-channel sums the weight slot's (input 5: C values, e.g. a BN
// parameter's (1, C, 1, 1), so its gradient needs no reshape op; the mean placeholder's (C,) without a weight)
template <int Like>
void like_x_then_weight_shape(const std::vector<Shape>& inputs, const Param&, std::vector<Shape>& outputs) {
    for (size_t i = 0; i < outputs.size(); ++i)
        outputs[i] = static_cast<int>(i) < Like ? inputs[0] : inputs[5];
}

void same_device_all(const std::vector<Device>& inputs, const Param&, std::vector<Device>& outputs) {
    outputs.assign(outputs.size(), inputs[0]);
}

void same_format_all(const std::vector<Format>& inputs, const Param&, std::vector<Format>& outputs) {
    outputs.assign(outputs.size(), inputs[0]);
}

const Tensor* slot(const std::vector<Tensor>& in, const Param& p, const char* flag, size_t i) {
    return p[flag].as<bool>() ? &in[i] : nullptr;
}

void cpu_act_train_forward(const std::vector<Tensor>& in, const Param& p, std::vector<Tensor>& out) {
    basebn::cpu::act_train_forward(in[0], nullptr, slot(in, p, "has_weight", 1), slot(in, p, "has_bias", 2),
                                   p["eps"].as<double>(), p["act"].as<int32_t>(), out[0], out[1], out[2], out[3],
                                   p["force_strided"].as<bool>());
}

void cpu_add_act_train_forward(const std::vector<Tensor>& in, const Param& p, std::vector<Tensor>& out) {
    basebn::cpu::act_train_forward(in[0], &in[1], slot(in, p, "has_weight", 2), slot(in, p, "has_bias", 3),
                                   p["eps"].as<double>(), p["act"].as<int32_t>(), out[0], out[1], out[2], out[3],
                                   p["force_strided"].as<bool>());
}

// The train forward, then the running-statistics update (bn_running_cpu.cpp) from its mean and the unbiased variance
// m2 * float(1 / (count - 1)), rounded as the Python side's float32 product: inputs after x [, shortcut], weight and
// bias are running_mean, running_var, bad; outputs after y, mean, m2, invstd are their new values.
template <bool Add>
void cpu_act_train_forward_update(const std::vector<Tensor>& in, const Param& p, std::vector<Tensor>& out) {
    constexpr size_t o = Add ? 1 : 0;
    basebn::cpu::act_train_forward(in[0], Add ? &in[1] : nullptr, slot(in, p, "has_weight", 1 + o),
                                   slot(in, p, "has_bias", 2 + o), p["eps"].as<double>(), p["act"].as<int32_t>(),
                                   out[0], out[1], out[2], out[3], p["force_strided"].as<bool>());
    const basebn::Dims d = basebn::dims_of(in[0]);
    custom_assert(static_cast<int64_t>(in[3 + o].size()) == d.C, "train forward update: running_mean has %zu values, "
                  "x has %lld channels", in[3 + o].size(), static_cast<long long>(d.C));
    const float scale = static_cast<float>(1.0 / (static_cast<double>(d.N * d.S) - 1.0));
    const float* m2 = out[2].data<float>();
    std::vector<float> var(static_cast<size_t>(d.C));
    for (int64_t c = 0; c < d.C; ++c)
        var[c] = m2[c] * scale;
    basebn::running::update(in[3 + o], in[4 + o], out[1].data<float>(), var.data(), in[5 + o], p["keep"].as<double>(),
                            out[4], out[5], out[6]);
}

// y like x; mean, m2, invstd (C,); the running statistics' new values in their shapes; bad' (1,)
template <size_t RunningAt>
void train_forward_update_shape(const std::vector<Shape>& inputs, const Param&, std::vector<Shape>& outputs) {
    outputs[0] = inputs[0];
    outputs[1] = outputs[2] = outputs[3] = Shape({inputs[0][1]});
    outputs[4] = inputs[RunningAt];
    outputs[5] = inputs[RunningAt + 1];
    outputs[6] = Shape({1});
}

void train_forward_update_dtype(const std::vector<DType>& inputs, const Param&, std::vector<DType>& outputs) {
    outputs.assign(outputs.size(), DType("float32"));
    outputs[0] = inputs[0];
    outputs[6] = DType("int32");
}

void cpu_act_train_backward(const std::vector<Tensor>& in, const Param& p, std::vector<Tensor>& out) {
    const bool shortcut = out.size() == 4;
    basebn::cpu::act_train_backward(in[0], in[1], in[2], in[3], in[4], slot(in, p, "has_weight", 5),
                                    slot(in, p, "has_bias", 6), p["act"].as<int32_t>(), out[0],
                                    shortcut ? &out[1] : nullptr, out[shortcut ? 2 : 1], out[shortcut ? 3 : 2],
                                    p["force_strided"].as<bool>());
}

}  // namespace

#define BASEBN_TRAIN_FORWARD_REST                                \
    .add_input("weight", {"float32"})                            \
            .add_input("bias", {"float32"})                      \
            .add_output("y", BASEBN_FLOATS)                      \
            .add_output("mean", {"float32"})                     \
            .add_output("m2", {"float32"})                       \
            .add_output("invstd", {"float32"})                   \
            .add_param("has_weight", false)                      \
            .add_param("has_bias", false)                        \
            .add_param("eps", 1e-5)                              \
            .add_param("act", 0)                                 \
            .add_param("force_strided", false)                   \
            .set_device_infer(same_device_all)                   \
            .set_format_infer(same_format_all)                   \
            .set_shape_infer(like_x_then_channels_shape<1>)      \
            .set_dtype_infer(like_x_then_channels_dtype<1>)

CUSTOM_OP_REG(BasebnBnActTrainForward)
        .set_description("basebn: local batch statistics and y = act(bn(x)) in one call")
        .add_input("x", BASEBN_FLOATS)
        BASEBN_TRAIN_FORWARD_REST
        .set_compute("x86", cpu_act_train_forward);

CUSTOM_OP_REG(BasebnBnAddActTrainForward)
        .set_description("basebn: local batch statistics and y = act(bn(x) + shortcut) in one call")
        .add_input("x", BASEBN_FLOATS)
        .add_input("shortcut", BASEBN_FLOATS)
        BASEBN_TRAIN_FORWARD_REST
        .set_compute("x86", cpu_add_act_train_forward);

#define BASEBN_TRAIN_BACKWARD_INPUTS            \
    .add_input("dy", BASEBN_FLOATS)             \
            .add_input("y", BASEBN_FLOATS)      \
            .add_input("x", BASEBN_FLOATS)      \
            .add_input("mean", {"float32"})     \
            .add_input("invstd", {"float32"})   \
            .add_input("weight", {"float32"})   \
            .add_input("bias", {"float32"})
#define BASEBN_TRAIN_BACKWARD_PARAMS           \
    .add_param("has_weight", false)            \
            .add_param("has_bias", false)      \
            .add_param("act", 0)               \
            .add_param("force_strided", false) \
            .set_device_infer(same_device_all) \
            .set_format_infer(same_format_all) \
            .set_compute("x86", cpu_act_train_backward)

CUSTOM_OP_REG(BasebnBnActTrainBackward)
        .set_description("basebn: the local BN -> act backward in one call: dx and the two per-channel sums")
        BASEBN_TRAIN_BACKWARD_INPUTS
        .add_output("dx", BASEBN_FLOATS)
        .add_output("sum_dz", {"float32"})
        .add_output("sum_dz_xhat", {"float32"})
        BASEBN_TRAIN_BACKWARD_PARAMS
        .set_shape_infer(like_x_then_weight_shape<1>)
        .set_dtype_infer(like_x_then_channels_dtype<1>);

CUSTOM_OP_REG(BasebnBnAddActTrainBackward)
        .set_description("basebn: BasebnBnActTrainBackward, and dshortcut = dz from the same pass")
        BASEBN_TRAIN_BACKWARD_INPUTS
        .add_output("dx", BASEBN_FLOATS)
        .add_output("dshortcut", BASEBN_FLOATS)
        .add_output("sum_dz", {"float32"})
        .add_output("sum_dz_xhat", {"float32"})
        BASEBN_TRAIN_BACKWARD_PARAMS
        .set_shape_infer(like_x_then_weight_shape<2>)
        .set_dtype_infer(like_x_then_channels_dtype<2>);

#define BASEBN_TRAIN_FORWARD_UPDATE_REST                        \
    .add_input("weight", {"float32"})                           \
            .add_input("bias", {"float32"})                     \
            .add_input("running_mean", {"float32"})             \
            .add_input("running_var", {"float32"})              \
            .add_input("bad", {"int32"})                        \
            .add_output("y", BASEBN_FLOATS)                     \
            .add_output("mean", {"float32"})                    \
            .add_output("m2", {"float32"})                      \
            .add_output("invstd", {"float32"})                  \
            .add_output("running_mean_out", {"float32"})        \
            .add_output("running_var_out", {"float32"})         \
            .add_output("bad_out", {"int32"})                   \
            .add_param("has_weight", false)                     \
            .add_param("has_bias", false)                       \
            .add_param("eps", 1e-5)                             \
            .add_param("act", 0)                                \
            .add_param("keep", 0.9)                             \
            .add_param("force_strided", false)                  \
            .set_device_infer(same_device_all)                  \
            .set_format_infer(same_format_all)                  \
            .set_dtype_infer(train_forward_update_dtype)

CUSTOM_OP_REG(BasebnBnActTrainForwardUpdate)
        .set_description("basebn: BasebnBnActTrainForward and the guarded running-statistics update in one call")
        .add_input("x", BASEBN_FLOATS)
        BASEBN_TRAIN_FORWARD_UPDATE_REST
        .set_shape_infer(train_forward_update_shape<3>)
        .set_compute("x86", cpu_act_train_forward_update<false>);

CUSTOM_OP_REG(BasebnBnAddActTrainForwardUpdate)
        .set_description("basebn: BasebnBnAddActTrainForward and the guarded running-statistics update in one call")
        .add_input("x", BASEBN_FLOATS)
        .add_input("shortcut", BASEBN_FLOATS)
        BASEBN_TRAIN_FORWARD_UPDATE_REST
        .set_shape_infer(train_forward_update_shape<4>)
        .set_compute("x86", cpu_act_train_forward_update<true>);

#undef BASEBN_TRAIN_FORWARD_REST
#undef BASEBN_TRAIN_FORWARD_UPDATE_REST
#undef BASEBN_TRAIN_BACKWARD_INPUTS
#undef BASEBN_TRAIN_BACKWARD_PARAMS

CUSTOM_OP_REG_END(BasebnBN)
