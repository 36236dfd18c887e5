"""Write a model as a dumped MegEngine graph (.mge) that MegEngine Lite and GraphInference load.

Input ``data`` (N, C, H, W) with a free batch size, output ``logits``; the graph is dumped with
MegEngine's optimize_for_inference (conv + bias + activation fused into ConvBias, ...).
"""
import numpy as np

from ..utils.fs import atomic_write_bytes
from .graph import trace_graph
from .prepare import prepare_for_export

__all__ = ["export_mge"]


def export_mge(model, path, input_shape, prepare=True, optimize=True):
    """Write `model` as a .mge graph at `path` for inputs shaped `input_shape` (N, C, H, W; N is free).

    With `prepare` the model first goes through prepare_for_export (the model itself is not changed);
    `optimize=False` writes the graph as traced. Returns the TracedGraph.
    """
    if prepare:
        model = prepare_for_export(model, np.zeros(input_shape, np.float32))
    traced = trace_graph(model, input_shape)
    atomic_write_bytes(path, traced.optimized if optimize else traced.unoptimized)
    return traced
