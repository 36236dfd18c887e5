"""Trace a prepared model into a dumped MegEngine inference graph, and read a dumped graph's operators.

The graph has one input ``data`` and one output ``logits``. The numpy weight-gradient tap is off
while tracing (every basebn conv is then a plain MegEngine conv). A model is traced at two batch
sizes and at two image sizes: the graph must not depend on the batch size (else it is refused),
and when it does not depend on the image size either, height and width are free (``spatial_free``).
"""
import hashlib
import io
import json

import numpy as np

import megengine as mge
from megengine import jit
from megengine.utils.network import Network

from ..layers.conv import fast_cpu_weight_grad
from .errors import ExportError

__all__ = ["INPUT_NAME", "OUTPUT_NAME", "TracedGraph", "trace_graph", "load_network", "forbidden_ops",
           "graph_signature"]

INPUT_NAME, OUTPUT_NAME = "data", "logits"
_FORBIDDEN_MARKS = ("Custom", "BatchNorm", "BN")  # op types Lite and ONNX cannot take from basebn


class TracedGraph:
    """A dumped graph: `unoptimized` and `optimized` (optimize_for_inference) bytes, the input shape it was
    traced at, and whether the image size is free (`spatial_free`)."""

    def __init__(self, unoptimized, optimized, input_shape, spatial_free):
        self.unoptimized, self.optimized = unoptimized, optimized
        self.input_shape, self.spatial_free = tuple(input_shape), spatial_free

    def network(self):
        """The unoptimized graph as a megengine.utils.network.Network (operators with params, inputs, outputs)."""
        return load_network(self.unoptimized)


def _trace(model, input_shape):
    """(jit.trace object after one call on a random batch of `input_shape`)."""
    @jit.trace(symbolic=True, capture_as_const=True)
    def infer(data):
        return model(data)

    data = np.random.default_rng(0).standard_normal(input_shape).astype(np.float32)
    out = infer(mge.tensor(data))
    if not isinstance(out, mge.Tensor):
        raise ExportError(f"the model returns {type(out).__name__}, not one tensor of logits: cannot export it")
    return infer


def _dump(traced, optimize, user_info=None):
    buf = io.BytesIO()
    try:
        traced.dump(buf, arg_names=[INPUT_NAME], output_names=[OUTPUT_NAME], optimize_for_inference=optimize,
                    keep_opr_name=True, keep_var_name=2, user_info=user_info)
    except RuntimeError as e:  # MegEngine refuses its own graph (e.g. GroupNorm's in 1.13)
        reason = str(e).strip().splitlines()[0]
        raise ExportError(f"MegEngine cannot serialize this model's traced graph: {reason}") from None
    return buf.getvalue()


def load_network(graph):
    """A dumped graph (bytes or a file path) as a Network; its `all_oprs` are in execution order."""
    if isinstance(graph, (bytes, bytearray)):
        graph = io.BytesIO(graph)
    return Network.load(graph)


def forbidden_ops(network):
    """Names and types of the operators a plain runtime cannot load: custom ops and BN ops."""
    return [f"{o.name} ({o.type})" for o in network.all_oprs if any(mark in o.type for mark in _FORBIDDEN_MARKS)]


def graph_signature(network):
    """A digest of the graph's operators, params, wiring and constant values (not of any var shape)."""
    index, h = {}, hashlib.sha256()
    for i, o in enumerate(network.all_oprs):
        for out in o.outputs:
            index[id(out)] = i
        params = json.dumps(o.params, sort_keys=True, default=str)
        h.update(f"{o.type}|{params}|{[index.get(id(v)) for v in o.inputs]}".encode())
        if hasattr(o, "numpy") and o.type != "Host2DeviceCopy":
            value = np.ascontiguousarray(o.numpy())
            h.update(f"{value.dtype}{value.shape}".encode() + value.tobytes())
    return h.hexdigest()


def _signature_at(model, input_shape):
    return graph_signature(load_network(_dump(_trace(model, input_shape), optimize=False)))


def trace_graph(model, input_shape, user_info=None):
    """Trace `model` (prepared: see prepare_for_export) on inputs of `input_shape` (N, C, H, W) -> TracedGraph.

    `user_info` (a str) goes into both dumps' serialization metadata (MegEngine pickles it). Raises ExportError
    when the graph holds a custom or BN op, or bakes in the batch size.
    """
    n, c, h, w = (int(v) for v in input_shape)
    fast = fast_cpu_weight_grad()
    fast_cpu_weight_grad(False)
    try:
        traced = _trace(model, (n, c, h, w))
        unoptimized = _dump(traced, optimize=False, user_info=user_info)
        network = load_network(unoptimized)
        bad = forbidden_ops(network)
        if bad:
            raise ExportError(f"the traced graph still holds {len(bad)} custom/BN op(s) a plain runtime cannot "
                              f"load, first {bad[0]}: pass the model through basebn.deploy.prepare_for_export")
        signature = graph_signature(network)
        if _signature_at(model, (n + 1, c, h, w)) != signature:
            raise ExportError("the model's graph depends on the batch size (it turns a shape into a Python "
                              "number): it cannot be exported with a free batch dimension")
        spatial_free = _spatial_free(model, (n, c, h, w), signature)
        optimized = _dump(traced, optimize=True, user_info=user_info)
    finally:
        fast_cpu_weight_grad(fast)
    return TracedGraph(unoptimized, optimized, (n, c, h, w), spatial_free)


def _spatial_free(model, shape, signature):
    """True when the graph traced at a larger image is the same graph (no size baked in)."""
    n, c, h, w = shape
    try:
        return _signature_at(model, (n, c, h + 32, w + 32)) == signature
    except Exception:  # noqa: BLE001 - a model that refuses another size has a fixed size
        return False
