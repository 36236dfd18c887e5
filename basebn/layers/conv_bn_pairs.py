"""Find Conv2d -> BN pairs whose conv output feeds only that BN, from a traced dataflow graph.

The model is traced once in eval mode (``megengine.traced_module``) with conv and BN classes as
opaque leaves; a pair qualifies when the conv's output node has exactly one user, a call of a BN
with that node as its only input, and is not a graph output. Flags and buffers are restored after.
"""
from typing import Any, List, Tuple

import numpy as np

import megengine as mge
import megengine.module as M
from megengine.traced_module import trace_module
from megengine.traced_module.expr import CallMethod, GetAttr
from megengine.traced_module.module_tracer import module_tracer
from megengine.traced_module.node import ModuleNode

from .conv import fast_cpu_weight_grad, is_conv2d
from .module_tree import find_module
from .norm import is_bn2d

__all__ = ["find_conv_bn_pairs", "example_input_for"]

_CALL_METHODS = ("__call__", "forward")


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
    parts = []
    while node is not top:
        expr = node.expr
        if not isinstance(expr, GetAttr):
            return None
        parts.append(expr.name)
        node = expr.inputs[0]
    return ".".join(reversed(parts))


def _trace(model, inp):
    """``trace_module(model, inp)`` in eval mode with convs and BNs as leaves; the model is restored after."""
    leaf_types = {type(m) for m in model.modules() if is_conv2d(m) or is_bn2d(m)}
    added = [t for t in leaf_types if t not in module_tracer._opaque_types]
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


def _module_calls(graph, top):
    """{module path: [CallMethod exprs]} of every method called on a submodule (all uses count)."""
    calls = {}
    for expr in graph.exprs():
        if isinstance(expr, CallMethod) and isinstance(expr.inputs[0], ModuleNode):
            path = _node_path(expr.inputs[0], top)
            if path is not None:
                calls.setdefault(path, []).append(expr)
    return calls


def _sole_bn_user(conv_expr, outputs, top):
    """Path of the module whose forward is the only user of the conv's output (None otherwise)."""
    if conv_expr.method not in _CALL_METHODS or len(conv_expr.outputs) != 1:
        return None
    out = conv_expr.outputs[0]
    if id(out) in outputs or len(out.users) != 1:
        return None
    user = out.users[0]
    if not (isinstance(user, CallMethod) and isinstance(user.inputs[0], ModuleNode)
            and user.method in _CALL_METHODS):
        return None
    # the conv output is the BN's first argument, and only that (a fused BN-add-act layer takes a shortcut too)
    if len(user.inputs) < 2 or user.inputs[1] is not out or any(i is out for i in user.inputs[2:]):
        return None
    return _node_path(user.inputs[0], top)


def _pairs_from_graph(model, traced):
    graph = traced.flatten().graph
    top = graph.inputs[0]
    outputs = {id(n) for n in graph.outputs}
    calls = _module_calls(graph, top)
    pairs = []
    for conv_path, conv_calls in calls.items():
        conv = find_module(model, conv_path)
        if len(conv_calls) != 1 or not is_conv2d(conv):
            continue
        bn_path = _sole_bn_user(conv_calls[0], outputs, top)
        if bn_path is None or len(calls.get(bn_path, ())) != 1:  # the BN called (or used) once only
            continue
        bn = find_module(model, bn_path)
        if is_bn2d(bn) and getattr(bn, "num_features", None) == conv.out_channels:
            pairs.append((conv_path, bn_path))
    return pairs


def find_conv_bn_pairs(model: M.Module, example_input: Any = None) -> List[Tuple[str, str]]:
    """List of (conv_name, bn_name): every Conv2d -> BN pair of `model` whose conv output feeds only the BN.

    Args:
        model: the model.
        example_input: a tensor/array, or tuple of forward arguments, to trace `model` on; without it one is
            taken from `model.example_input` / `model.input_shape` or inferred (see `example_input_for`).

    Returns:
        The pairs.

    Raises:
        RuntimeError: the model cannot be traced with any candidate input.
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
