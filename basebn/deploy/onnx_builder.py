"""OnnxGraphBuilder: the state of one MegEngine-graph -> ONNX conversion (names, nodes, initializers).

Every MegEngine var gets one ONNX name; constants become initializers when first used; integer
tensors (MegEngine's int32 shapes and indices) are int64 in ONNX, as ONNX's shape ops want.
The `onnx` package is passed in (an optional dependency, imported by the caller).
"""
import re

import numpy as np

from .errors import ExportError

__all__ = ["OnnxGraphBuilder", "CONST_TYPES", "onnx_dtype", "unsupported", "rank", "output_of"]

CONST_TYPES = ("ImmutableTensor", "SharedDeviceTensor")


def onnx_dtype(dtype):
    """The numpy dtype a MegEngine dtype becomes in ONNX (int32 -> int64)."""
    dtype = np.dtype(dtype)
    return np.dtype(np.int64) if dtype.kind in "iu" else dtype


def unsupported(opr, what=""):
    """Raise the ExportError naming an operator (and `what` about it) that has no ONNX mapping."""
    raise ExportError(f"no ONNX mapping for MegEngine operator {opr.name!r} of type {opr.type}{what}: "
                      f"this model cannot be exported to ONNX (the .mge format takes any MegEngine graph)")


def rank(var):
    """Number of dimensions of a graph var (its statically inferred shape)."""
    return len(tuple(var.shape))


def output_of(opr):
    """The (first) output var of an operator."""
    return opr.outputs[0]


class OnnxGraphBuilder:
    """Collects ONNX nodes and initializers while MegEngine operators are converted in graph order."""

    def __init__(self, onnx):
        self.onnx = onnx
        self.nodes, self.initializers = [], []
        self._names = {}  # id(var) -> ONNX name
        self._taken = set()
        self.absorbed = set()  # ids of operators folded into an earlier one (a conv's bias add)

    def fresh(self, base):
        """A new unique ONNX name built from `base`."""
        base = re.sub(r"[^0-9A-Za-z_.:\-\[\]]", "_", str(base)) or "v"
        name, k = base, 1
        while name in self._taken:
            name, k = f"{base}__{k}", k + 1
        self._taken.add(name)
        return name

    def reserve(self, name):
        """Take `name` (the graph's input and output names) so no other tensor gets it."""
        self._taken.add(name)

    def bind(self, var, name):
        """Var `var` is the ONNX tensor `name` (an operator's output, or an alias of its input)."""
        self._names[id(var)] = name

    def is_const(self, var):
        """`var` is produced by a constant operator."""
        return var.owner is not None and var.owner.type in CONST_TYPES

    def const_value(self, var):
        """The numpy value of a constant var, ONNX dtype (int32 -> int64)."""
        value = np.asarray(var.owner.numpy())
        return value.astype(onnx_dtype(value.dtype))

    def name(self, var):
        """The ONNX name of `var`; a constant is added as an initializer on first use."""
        key = id(var)
        if key not in self._names:
            if not self.is_const(var):
                raise ExportError(f"internal: var {var.name!r} used before it was produced")
            self._names[key] = self.const(self.const_value(var), var.name)
        return self._names[key]

    def const(self, array, base="const"):
        """A new initializer holding `array`; returns its name."""
        name = self.fresh(base)
        self.initializers.append(self.onnx.numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def int_const(self, values, base="const"):
        """A 1-D int64 initializer."""
        return self.const(np.asarray(values, np.int64).reshape(-1), base)

    def node(self, op_type, inputs, base, n_outputs=1, **attrs):
        """Append an ONNX node; returns its output name (a list when n_outputs > 1)."""
        outputs = [self.fresh(base if n_outputs == 1 else f"{base}:{i}") for i in range(n_outputs)]
        name = self.fresh(f"{base}/{op_type}")
        self.nodes.append(self.onnx.helper.make_node(op_type, list(inputs), outputs, name=name, **attrs))
        return outputs[0] if n_outputs == 1 else outputs

    def cast_to(self, name, src_dtype, dst_dtype, base):
        """`name` cast to `dst_dtype` (ONNX dtypes) when it differs from `src_dtype`."""
        src, dst = onnx_dtype(src_dtype), onnx_dtype(dst_dtype)
        if src == dst:
            return name
        return self.node("Cast", [name], f"{base}.cast", to=self.onnx.helper.np_dtype_to_tensor_dtype(dst))
