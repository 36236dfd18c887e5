"""Write a model as a dumped MegEngine graph (.mge) that MegEngine Lite and GraphInference load.

Input ``data`` (N, C, H, W) with a free batch size, output ``logits``; the graph is dumped with
MegEngine's optimize_for_inference (conv + bias + activation fused into ConvBias, ...). Preprocessing metadata
(preprocess_info.py) goes into the dump's serialization metadata as one JSON text (MegEngine's ``user_info``).
"""
import json

import numpy as np

from ..utils.fs import atomic_write_bytes
from .graph import trace_graph
from .prepare import prepare_for_export
from .preprocess_info import encode_info

__all__ = ["export_mge"]


def export_mge(model, path, input_shape, prepare=True, optimize=True, metadata=None):
    """Write `model` as a .mge graph at `path` for inputs shaped `input_shape` (N, C, H, W; N is free).

    With `prepare` the model first goes through prepare_for_export (the model itself is not changed);
    `optimize=False` writes the graph as traced; `metadata` (preprocess_info's dict) is stored in the file.
    Returns the TracedGraph.
    """
    if prepare:
        model = prepare_for_export(model, np.zeros(input_shape, np.float32))
    user_info = None if metadata is None else json.dumps(encode_info(metadata), sort_keys=True)
    traced = trace_graph(model, input_shape, user_info=user_info)
    atomic_write_bytes(path, traced.optimized if optimize else traced.unoptimized)
    return traced
