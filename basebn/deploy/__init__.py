"""Deploy a trained model: a dumped MegEngine graph (.mge, for MegEngine Lite) or ONNX, and run either.

``prepare_for_export`` (plain ops, BN folded), ``export_mge`` / ``export_onnx`` (write a file),
``run_exported`` / ``load_exported`` (Lite, GraphInference or onnxruntime), ``max_abs_difference`` /
``compare_with_eager`` (exported vs eager), ``preprocess_info`` / ``read_preprocess_info`` (what a file expects:
its metadata). ``python -m basebn.deploy`` is the CLI.
"""
from .errors import ExportError
from .graph import INPUT_NAME, OUTPUT_NAME, TracedGraph, trace_graph
from .mge_export import export_mge
from .onnx_export import export_onnx, graph_to_onnx
from .prepare import ChannelAffine, prepare_for_export
from .preprocess_info import describe_preprocess, preprocess_info, read_preprocess_info
from .runtime import (BACKENDS, ExportedModel, compare_with_eager, eager_logits, load_exported, max_abs_difference,
                      run_exported)

__all__ = ["ExportError", "INPUT_NAME", "OUTPUT_NAME", "TracedGraph", "trace_graph", "export_mge", "export_onnx",
           "graph_to_onnx", "ChannelAffine", "prepare_for_export", "BACKENDS", "ExportedModel", "eager_logits",
           "load_exported", "max_abs_difference", "compare_with_eager", "run_exported", "preprocess_info",
           "read_preprocess_info", "describe_preprocess"]
