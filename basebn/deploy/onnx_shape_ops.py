"""MegEngine shape operators -> ONNX nodes (SHAPE_OPS): the Shape / Gather / Concat / Slice / Reshape / Expand /
Transpose / Squeeze arithmetic that flattens, computed-shape reshapes, slicing and channel shuffles trace to.

Shapes stay computed in the graph (int64 in ONNX), so the batch size and image size remain free.
"""
import numpy as np

from .onnx_builder import onnx_dtype, output_of as _out, rank as _rank, unsupported as _unsupported

__all__ = ["SHAPE_OPS"]

INT64_MAX, INT64_MIN = np.iinfo(np.int64).max, np.iinfo(np.int64).min


def _identity(b, opr):
    b.bind(_out(opr), b.name(opr.inputs[0]))


def _type_cvt(b, opr):
    dst = onnx_dtype(_out(opr).dtype)
    b.bind(_out(opr), b.node("Cast", [b.name(opr.inputs[0])], opr.name, to=b.onnx.helper.np_dtype_to_tensor_dtype(dst)))


def _get_var_shape(b, opr):
    x = opr.inputs[0]
    name = b.node("Shape", [b.name(x)], opr.name)
    axis = opr.params.get("axis")
    if axis is not None and 0 <= axis < _rank(x):
        name = b.node("Gather", [name, b.int_const([axis], "axis")], opr.name + ".axis", axis=0)
    b.bind(_out(opr), name)


def _concat(b, opr):
    names = [b.name(v) for v in opr.inputs]
    b.bind(_out(opr), b.node("Concat", names, opr.name, axis=int(opr.params["axis"])))


def _reshape(b, opr):
    """Reshape; MegEngine's unspecified axis (`axis` param, the -1 of x.reshape(n, -1)) is set to -1 explicitly."""
    x, shape = opr.inputs
    length = tuple(shape.shape)[0]
    axis = opr.params.get("axis")
    free = axis is not None and 0 <= axis < length
    if b.is_const(shape):
        target = b.const_value(shape).reshape(-1).copy()
        if free:
            target[axis] = -1
        target_name = b.int_const(target, f"{opr.name}.shape")
    else:
        target_name = b.name(shape)
        if free:
            keep, minus = np.ones(length, np.int64), np.zeros(length, np.int64)
            keep[axis], minus[axis] = 0, -1
            masked = b.node("Mul", [target_name, b.int_const(keep, "keep")], opr.name + ".keep")
            target_name = b.node("Add", [masked, b.int_const(minus, "minus_one_at")], opr.name + ".shape")
    b.bind(_out(opr), b.node("Reshape", [b.name(x), target_name], opr.name))


def _broadcast(b, opr):
    x, shape = opr.inputs
    b.bind(_out(opr), b.node("Expand", [b.name(x), b.name(shape)], opr.name))


def _dimshuffle(b, opr):
    pattern = list(opr.params["pattern"])
    x = opr.inputs[0]
    perm = [a for a in pattern if a >= 0]
    if sorted(perm) != list(range(_rank(x))):
        _unsupported(opr, f" (pattern {pattern} drops axes)")
    name = b.node("Transpose", [b.name(x)], opr.name, perm=perm)
    new_axes = [i for i, a in enumerate(pattern) if a < 0]
    if new_axes:
        name = b.node("Unsqueeze", [name, b.int_const(new_axes, "axes")], opr.name + ".unsqueeze")
    b.bind(_out(opr), name)


def _axis_add_remove(b, opr):
    """AddAxis / RemoveAxis, one axis at a time in MegEngine's order."""
    kind = "Unsqueeze" if opr.opdef.__name__ == "AddAxis" else "Squeeze"
    name = b.name(opr.inputs[0])
    for axis in opr.params["axis"]:
        name = b.node(kind, [name, b.int_const([axis], "axes")], opr.name)
    b.bind(_out(opr), name)


def _slice_bounds(b, opr, item_vars):
    """(starts, ends, axes, steps) ONNX names for the begin/end/step items."""
    parts = {"starts": [], "ends": [], "axes": [], "steps": []}
    for axis, begin, end, step in item_vars:
        step_value = b.const_value(step).reshape(-1)[0] if step is not None and b.is_const(step) else 1
        if step is not None and not b.is_const(step) and (begin is None or end is None):
            _unsupported(opr, " (a computed step with an open slice bound)")
        default_begin, default_end = (0, INT64_MAX) if step_value > 0 else (INT64_MAX, INT64_MIN)
        for key, var, default in (("starts", begin, default_begin), ("ends", end, default_end), ("steps", step, 1)):
            parts[key].append((var, default))
        parts["axes"].append((None, axis))
    names = []
    for key, items in parts.items():
        if all(var is None or b.is_const(var) for var, _ in items):
            values = [default if var is None else b.const_value(var).reshape(-1)[0] for var, default in items]
            names.append(b.int_const(values, f"{opr.name}.{key}"))
        else:
            pieces = [b.int_const([default], key) if var is None else b.name(var) for var, default in items]
            names.append(b.node("Concat", pieces, f"{opr.name}.{key}", axis=0))
    return names


def _subtensor(b, opr):
    """x[begin:end:step, idx, ...] -> Slice, then Gather for each index, then Squeeze of the indexed axes."""
    x, rest = opr.inputs[0], list(opr.inputs[1:])
    slices, indices = [], []
    for axis, has_begin, has_end, has_step, has_idx in opr.params["items"]:
        taken = [rest.pop(0) if flag else None for flag in (has_begin, has_end, has_step, has_idx)]
        if has_idx:
            indices.append((axis, taken[3]))
        else:
            slices.append((axis, *taken[:3]))
    name = b.name(x)
    if slices:
        name = b.node("Slice", [name, *_slice_bounds(b, opr, slices)], opr.name + ".slice")
    for axis, idx in indices:
        name = b.node("Gather", [name, b.name(idx)], opr.name + ".index", axis=axis)
    if indices:
        axes = sorted(axis for axis, _ in indices)
        if len(axes) == _rank(x):  # MegEngine keeps a one-element vector
            name = b.node("Reshape", [name, b.int_const([1], "one")], opr.name)
        else:
            name = b.node("Squeeze", [name, b.int_const(axes, "axes")], opr.name)
    b.bind(_out(opr), name)


SHAPE_OPS = {
    "Identity": _identity, "Copy": _identity, "TypeCvt": _type_cvt,
    "GetVarShape": _get_var_shape, "Concat": _concat, "Reshape": _reshape, "Broadcast": _broadcast,
    "Dimshuffle": _dimshuffle, "AxisAddRemove": _axis_add_remove, "Subtensor": _subtensor,
}
