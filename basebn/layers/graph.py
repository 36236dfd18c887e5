"""Find Conv2d -> BatchNorm pairs whose conv output feeds only that BN, from a traced dataflow graph.

`find_conv_bn_pairs(model, example_input)` builds a `megengine.traced_module.TracedModule` of the
model (`trace_module`), flattens it to one graph and, for every call of a Conv2d, checks the users
of the node it produced: the pair qualifies when that node has exactly one user, a call of a
BatchNorm-like module with the node as its only input, and is not a graph output. traced_module
records every use of a tensor, functional ops and tensor methods included (F.relu, `a + b`,
`x.mean()` ...), so a conv whose output also feeds a residual add or a second branch is seen.
Modules are named by their attribute path in `model` (`layer1.0.conv1`), the same names as
`model.named_modules()`.

Conv2d subclasses (basebn's fast-gradient Conv2d) and BN-like modules (SyncBatchNorm,
FrozenBatchNorm2d) are traced as opaque leaves: they are registered as builtin for the duration of
the trace only. The trace runs the model once in eval mode on `example_input`; training flags and
all buffers are restored afterwards, so it has no side effect on running statistics.
"""
import numpy as np

import megengine as mge
import megengine.module as M

__all__ = ["find_conv_bn_pairs", "is_conv2d", "is_batchnorm2d", "resolve_module", "set_module", "example_input_for"]

_CALL_METHODS = ("__call__", "forward")


def is_conv2d(m):
    """A plain (float) 2-D convolution module: megengine.module.Conv2d or a subclass, not QAT/quantized."""
    if not isinstance(m, M.Conv2d):
        return False
    from megengine.module.qat import QATModule

    return not isinstance(m, QATModule)


def is_batchnorm2d(m):
    """BatchNorm2d, basebn's SyncBatchNorm / FrozenBatchNorm2d, or any module with BN's attribute names."""
    from .frozen_bn import FrozenBatchNorm2d

    if isinstance(m, FrozenBatchNorm2d):
        return True
    if isinstance(m, M.BatchNorm1d):
        return False
    if isinstance(m, M.BatchNorm2d):
        return True
    if not isinstance(m, M.Module) or "batchnorm" not in type(m).__name__.lower():
        return False
    return all(hasattr(m, a) for a in ("weight", "bias", "running_mean", "running_var", "eps", "num_features"))


def resolve_module(model, path):
    """The object at dotted attribute path `path` of `model` ('' is the model); list/dict items by key."""
    obj = model
    if not path:
        return obj
    for part in path.split("."):
        if isinstance(obj, (list, tuple)):
            obj = obj[int(part)]
        elif isinstance(obj, dict):
            obj = obj[part]
        else:
            obj = getattr(obj, part)
    return obj


def set_module(model, path, new):
    """Replace the module at dotted path `path` of `model` by `new` (attributes, list items, dict values)."""
    parent_path, _, last = path.rpartition(".")
    parent = resolve_module(model, parent_path)
    if isinstance(parent, list):
        parent[int(last)] = new
    elif isinstance(parent, dict):
        parent[last] = new
    elif isinstance(parent, tuple):
        raise TypeError(f"cannot replace {path!r}: it lives in a tuple")
    else:
        setattr(parent, last, new)


def example_input_for(model, example_input=None, sizes=(32, 64, 224)):
    """Candidate example inputs, in order: the argument, `model.example_input` (a tensor/array, or a
    callable returning one), `model.input_shape`, then (2, C, S, S) for S in `sizes` with C the
    in_channels of the first Conv2d in module order."""
    if example_input is None:
        example_input = getattr(model, "example_input", None)
        if callable(example_input) and not isinstance(example_input, (mge.Tensor, np.ndarray)):
            example_input = example_input()
    if example_input is not None:
        return [example_input]
    shape = getattr(model, "input_shape", None)
    if shape is not None:
        return [np.zeros(tuple(shape), dtype=np.float32)]
    first = next((m for m in model.modules() if is_conv2d(m)), None)
    if first is None:
        return []
    return [np.zeros((2, first.in_channels, s, s), dtype=np.float32) for s in sizes]


def _as_tensor(x):
    if isinstance(x, (list, tuple)):
        return type(x)(_as_tensor(v) for v in x)
    return x if isinstance(x, mge.Tensor) else mge.tensor(np.asarray(x))


def _node_path(node, top):
    """Attribute path of a ModuleNode from the graph input `top`, following its GetAttr chain."""
    from megengine.traced_module.expr import GetAttr

    parts = []
    while node is not top:
        expr = node.expr
        if not isinstance(expr, GetAttr):
            return None
        parts.append(expr.name)
        node = expr.inputs[0]
    return ".".join(reversed(parts))


def _trace(model, inp):
    from megengine.traced_module import trace_module
    from megengine.traced_module.module_tracer import module_tracer

    leaf_types = {type(m) for m in model.modules() if is_conv2d(m) or is_batchnorm2d(m)}
    added = [t for t in leaf_types if t not in module_tracer._opaque_types]
    from .conv import fast_cpu_weight_grad

    fast = fast_cpu_weight_grad()
    flags = [(m, m.training) for m in model.modules()]
    saved = [(t, t.numpy().copy()) for t in model.buffers()]  # restored below, should any change
    try:
        for t in added:
            module_tracer.register_as_builtin(t)
        fast_cpu_weight_grad(False)
        model.eval()
        args = inp if isinstance(inp, tuple) else (inp,)
        return trace_module(model, *args)
    finally:
        for t in added:
            module_tracer._opaque_types.discard(t)
        fast_cpu_weight_grad(fast)
        for m, f in flags:
            m.training = f
        for t, v in saved:
            if not np.array_equal(t.numpy(), v):
                t._reset(type(t)(v, dtype=t.dtype, device=t.device))


def _pairs_from_graph(model, traced):
    from megengine.traced_module.expr import CallMethod
    from megengine.traced_module.node import ModuleNode

    graph = traced.flatten().graph
    top = graph.inputs[0]
    outputs = {id(n) for n in graph.outputs}
    calls = {}  # path -> list of CallMethod exprs
    for expr in graph.exprs():
        if isinstance(expr, CallMethod) and isinstance(expr.inputs[0], ModuleNode):  # any method: all uses count
            path = _node_path(expr.inputs[0], top)
            if path is not None:
                calls.setdefault(path, []).append(expr)
    pairs = []
    for conv_path, conv_calls in calls.items():
        if len(conv_calls) != 1:
            continue
        try:
            conv = resolve_module(model, conv_path)
        except (AttributeError, IndexError, KeyError, ValueError):
            continue
        if not is_conv2d(conv):
            continue
        expr = conv_calls[0]
        if expr.method not in _CALL_METHODS or len(expr.outputs) != 1:
            continue
        out = expr.outputs[0]
        if id(out) in outputs or len(out.users) != 1:
            continue
        user = out.users[0]
        if not (isinstance(user, CallMethod) and isinstance(user.inputs[0], ModuleNode)
                and user.method in _CALL_METHODS):
            continue
        if len(user.inputs) != 2 or user.inputs[1] is not out:
            continue
        bn_path = _node_path(user.inputs[0], top)
        if bn_path is None or len(calls.get(bn_path, ())) != 1:  # the BN called (or used) once only
            continue
        try:
            bn = resolve_module(model, bn_path)
        except (AttributeError, IndexError, KeyError, ValueError):
            continue
        if not is_batchnorm2d(bn) or getattr(bn, "num_features", None) != conv.out_channels:
            continue
        pairs.append((conv_path, bn_path))
    return pairs


def find_conv_bn_pairs(model, example_input=None):
    """List of (conv_name, bn_name): every Conv2d -> BN pair of `model` whose conv output feeds only the BN.

    `example_input` (tensor/array, or tuple of forward arguments) drives the trace; without it one is
    taken from `model.example_input` / `model.input_shape` or inferred (see `example_input_for`).
    Raises RuntimeError when the model cannot be traced with any candidate input.
    """
    candidates = example_input_for(model, example_input)
    if not candidates:
        raise RuntimeError("no example input: pass example_input=, or set model.example_input / model.input_shape")
    errors = []
    for inp in candidates:
        try:
            traced = _trace(model, _as_tensor(inp))
        except Exception as e:  # noqa: BLE001 - a too-small inferred input fails inside the model; try the next
            errors.append(f"{getattr(inp, 'shape', '?')}: {type(e).__name__}: {e}")
            continue
        return _pairs_from_graph(model, traced)
    raise RuntimeError("could not trace the model to find conv-BN pairs (pass example_input= or pairs=):\n  "
                       + "\n  ".join(errors))

