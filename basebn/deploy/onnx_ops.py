"""MegEngine operator -> ONNX nodes, one function per operator type (OPS), for the ops image classifiers
trace to: conv (+ its bias add, folded), pooling, reductions, matmul / Gemm (+ bias), elementwise
activations and arithmetic, and (onnx_shape_ops) the ops of reshapes, flattens, slices and shuffles.

A converter gets the builder and the operator, emits nodes and binds the operator's outputs; an
operator or mode not listed raises ExportError naming it, so a graph is never written wrongly.
"""
import numpy as np

from .onnx_builder import onnx_dtype, output_of as _out, rank as _rank, unsupported as _unsupported
from .onnx_shape_ops import SHAPE_OPS

__all__ = ["OPS", "ELEMWISE_UNARY", "ELEMWISE_BINARY", "convert_op"]

ELEMWISE_UNARY = {"RELU": "Relu", "SIGMOID": "Sigmoid", "TANH": "Tanh", "EXP": "Exp", "LOG": "Log", "ABS": "Abs",
                  "NEGATE": "Neg", "SQRT": "Sqrt", "FLOOR": "Floor", "CEIL": "Ceil", "ERF": "Erf", "SIN": "Sin",
                  "COS": "Cos", "H_SWISH": "HardSwish", "SOFTPLUS": "Softplus"}
ELEMWISE_BINARY = {"ADD": "Add", "SUB": "Sub", "MUL": "Mul", "TRUE_DIV": "Div", "MAX": "Max", "MIN": "Min",
                   "POW": "Pow", "PRELU": "PRelu"}



def _sole_user(var):
    users = list(var.users)
    return users[0] if len(users) == 1 else None


def _bias_add(b, opr, bias_shapes):
    """(the ADD operator, its constant addend as a 1-D array) when `opr`'s output feeds only an ADD of a
    constant of one of `bias_shapes` (one value per output channel); else (None, None)."""
    out = _out(opr)
    user = _sole_user(out)
    if user is None or user.type != "Elemwise" or user.params.get("mode") != "ADD" or len(user.inputs) != 2:
        return None, None
    other = user.inputs[1] if user.inputs[0] is out else user.inputs[0]
    if not b.is_const(other) or other is out:
        return None, None
    if tuple(other.shape) not in bias_shapes:
        return None, None
    return user, b.const_value(other).reshape(-1)


# ------------------------------------------------------------------------------------------- layers
def _convolution(b, opr):
    p = opr.params
    if p.get("format", "NCHW") != "NCHW" or p.get("mode") != "CROSS_CORRELATION":
        _unsupported(opr, f" (format {p.get('format')}, mode {p.get('mode')})")
    x, w = opr.inputs[:2]
    if len(opr.inputs) != 2:
        _unsupported(opr, f" with {len(opr.inputs)} inputs")
    wshape = tuple(w.shape)
    groups = wshape[0] if p["sparse"] == "GROUP" else 1
    kernel4d = (wshape[0] * wshape[1],) + wshape[2:] if groups > 1 else wshape
    if b.is_const(w):
        weight = b.const(b.const_value(w).reshape(kernel4d), w.name)
    elif groups > 1:
        weight = b.node("Reshape", [b.name(w), b.int_const(kernel4d, f"{w.name}.shape")], f"{w.name}.4d")
    else:
        weight = b.name(w)
    inputs = [b.name(x), weight]
    add, bias = _bias_add(b, opr, [(1, kernel4d[0], 1, 1)])
    if add is not None:
        inputs.append(b.const(bias, f"{opr.name}.bias"))
        b.absorbed.add(id(add))
    name = b.node("Conv", inputs, opr.name, group=groups, kernel_shape=list(kernel4d[2:]),
                  strides=[p["stride_h"], p["stride_w"]], dilations=[p["dilate_h"], p["dilate_w"]],
                  pads=[p["pad_h"], p["pad_w"], p["pad_h"], p["pad_w"]])
    b.bind(_out(opr), name)
    if add is not None:
        b.bind(_out(add), name)


def _pooling(b, opr):
    p = opr.params
    if p.get("format", "NCHW") != "NCHW":
        _unsupported(opr, f" (format {p.get('format')})")
    kind = {"MAX": "MaxPool", "AVERAGE": "AveragePool", "AVERAGE_COUNT_EXCLUDE_PADDING": "AveragePool"}.get(p["mode"])
    if kind is None:
        _unsupported(opr, f" (mode {p['mode']})")
    attrs = dict(kernel_shape=[p["window_h"], p["window_w"]], strides=[p["stride_h"], p["stride_w"]],
                 pads=[p["pad_h"], p["pad_w"], p["pad_h"], p["pad_w"]])
    if kind == "AveragePool":
        attrs["count_include_pad"] = int(p["mode"] == "AVERAGE")
    b.bind(_out(opr), b.node(kind, [b.name(opr.inputs[0])], opr.name, **attrs))


def _adaptive_pooling(b, opr):
    out_hw = tuple(_out(opr).shape)[2:]
    if opr.params.get("format", "NCHW") != "NCHW" or out_hw != (1, 1) or opr.params["mode"] not in ("MAX", "AVERAGE"):
        _unsupported(opr, f" (mode {opr.params.get('mode')}, output {out_hw}; only global pooling maps)")
    kind = "GlobalMaxPool" if opr.params["mode"] == "MAX" else "GlobalAveragePool"
    b.bind(_out(opr), b.node(kind, [b.name(opr.inputs[0])], opr.name))


def _matrix_mul(b, opr):
    """2-D MatrixMul (a Linear layer) -> Gemm, with the following bias add folded in."""
    p = opr.params
    a, w = opr.inputs
    if _rank(a) != 2 or _rank(w) != 2:
        _unsupported(opr, f" on {_rank(a)}-D x {_rank(w)}-D inputs")
    inputs = [b.name(a), b.name(w)]
    width = tuple(_out(opr).shape)[1]
    add, bias = _bias_add(b, opr, [(1, width), (width,)])
    if add is not None:
        inputs.append(b.const(bias, f"{opr.name}.bias"))
        b.absorbed.add(id(add))
    name = b.node("Gemm", inputs, opr.name, transA=int(p.get("transposeA", False)),
                  transB=int(p.get("transposeB", False)))
    b.bind(_out(opr), name)
    if add is not None:
        b.bind(_out(add), name)


def _batched_matmul(b, opr):
    p = opr.params
    names = []
    for var, flag in zip(opr.inputs, (p.get("transposeA", False), p.get("transposeB", False))):
        name = b.name(var)
        if flag:
            r = _rank(var)
            name = b.node("Transpose", [name], f"{opr.name}.t", perm=list(range(r - 2)) + [r - 1, r - 2])
        names.append(name)
    b.bind(_out(opr), b.node("MatMul", names, opr.name))


_REDUCE = {"MEAN": "ReduceMean", "SUM": "ReduceSum", "MAX": "ReduceMax", "MIN": "ReduceMin", "PRODUCT": "ReduceProd",
           "SUM_SQR": "ReduceSumSquare"}


def _reduce(b, opr):
    kind = _REDUCE.get(opr.params["mode"])
    x = opr.inputs[0]
    axis = opr.params.get("axis")
    if kind is None or len(opr.inputs) != 1:
        _unsupported(opr, f" (mode {opr.params['mode']}, {len(opr.inputs)} inputs)")
    if axis is None or not 0 <= axis < _rank(x):  # no axis: a reduction of everything, to shape (1,)
        name = b.node(kind, [b.name(x)], opr.name, keepdims=0)
        b.bind(_out(opr), b.node("Reshape", [name, b.int_const([1], "one")], f"{opr.name}.1d"))
        return
    if kind == "ReduceSum":  # axes is an input from opset 13
        name = b.node(kind, [b.name(x), b.int_const([axis], "axes")], opr.name, keepdims=1)
    else:
        name = b.node(kind, [b.name(x)], opr.name, axes=[axis], keepdims=1)
    b.bind(_out(opr), name)


# -------------------------------------------------------------------------------------- elementwise
def _elemwise_inputs(b, opr):
    """ONNX names of the inputs, cast to the output's dtype where they differ (int shapes in float math)."""
    dtype = _out(opr).dtype
    return [b.cast_to(b.name(v), v.dtype, dtype, opr.name) for v in opr.inputs]


def _gelu(b, x, base):
    half = b.const(np.array(0.5, np.float32), "half")
    one = b.const(np.array(1.0, np.float32), "one_f")
    erf = b.node("Erf", [b.node("Mul", [x, b.const(np.array(1 / np.sqrt(2), np.float32), "rsqrt2")], base + ".s")],
                 base + ".erf")
    return b.node("Mul", [b.node("Mul", [x, half], base + ".h"), b.node("Add", [erf, one], base + ".p")], base)


def _floor_div(b, opr, a, c):
    if np.dtype(onnx_dtype(_out(opr).dtype)).kind != "f":  # exact floor for ints up to 2**53
        f64 = b.onnx.TensorProto.DOUBLE
        q = b.node("Div", [b.node("Cast", [a], opr.name + ".a", to=f64), b.node("Cast", [c], opr.name + ".b", to=f64)],
                   opr.name + ".q")
        return b.node("Cast", [b.node("Floor", [q], opr.name + ".f")], opr.name, to=b.onnx.TensorProto.INT64)
    return b.node("Floor", [b.node("Div", [a, c], opr.name + ".q")], opr.name)


def _elemwise(b, opr):
    mode = opr.params["mode"]
    ins, base = _elemwise_inputs(b, opr), opr.name
    if mode in ELEMWISE_UNARY and len(ins) == 1:
        out = b.node(ELEMWISE_UNARY[mode], ins, base)
    elif mode in ELEMWISE_BINARY and len(ins) == 2:
        out = b.node(ELEMWISE_BINARY[mode], ins, base)
    elif mode == "SILU":
        out = b.node("Mul", [ins[0], b.node("Sigmoid", ins, base + ".sig")], base)
    elif mode == "HSIGMOID":
        out = b.node("HardSigmoid", ins, base, alpha=1.0 / 6, beta=0.5)
    elif mode == "RELU6":
        zero, six = b.const(np.array(0, np.float32), "zero"), b.const(np.array(6, np.float32), "six")
        out = b.node("Clip", [ins[0], zero, six], base)
    elif mode == "SQUARE":
        out = b.node("Mul", [ins[0], ins[0]], base)
    elif mode == "GELU":
        out = _gelu(b, ins[0], base)
    elif mode == "FLOOR_DIV":
        out = _floor_div(b, opr, *ins)
    elif mode in ("FUSE_ADD_RELU", "FUSE_ADD_SIGMOID", "FUSE_ADD_TANH", "FUSE_ADD_H_SWISH"):
        act = {"FUSE_ADD_RELU": "Relu", "FUSE_ADD_SIGMOID": "Sigmoid", "FUSE_ADD_TANH": "Tanh",
               "FUSE_ADD_H_SWISH": "HardSwish"}[mode]
        out = b.node(act, [b.node("Add", ins, base + ".add")], base)
    elif mode == "FUSE_MUL_ADD3":
        out = b.node("Add", [b.node("Mul", ins[:2], base + ".mul"), ins[2]], base)
    else:
        _unsupported(opr, f" (mode {mode})")
    b.bind(_out(opr), out)


OPS = {
    "Convolution": _convolution, "ConvolutionForward": _convolution,
    "Pooling": _pooling, "PoolingForward": _pooling,
    "AdaptivePooling": _adaptive_pooling, "AdaptivePoolingForward": _adaptive_pooling,
    "MatrixMul": _matrix_mul, "BatchedMatmul": _batched_matmul, "BatchedMatrixMul": _batched_matmul,
    "Reduce": _reduce, "Elemwise": _elemwise,
    **SHAPE_OPS,
}


def convert_op(b, opr):
    """Emit the ONNX nodes of MegEngine operator `opr` (ExportError when it has no mapping)."""
    convert = OPS.get(opr.type)
    if convert is None:
        _unsupported(opr)
    convert(b, opr)
