"""Write ONNX from a traced MegEngine graph with the `onnx` helper API (no converter package).

The graph's operators are walked in execution order (megengine.utils.network reads the dumped
graph) and mapped one by one (onnx_ops.OPS). Opset 17, IR version 8; the batch dimension is
symbolic, height and width too when the traced graph does not depend on them; the model passes
``onnx.checker.check_model(full_check=True)`` before it is written. Preprocessing metadata (preprocess_info.py)
goes into the model's ``metadata_props``.
"""
import numpy as np

from ..utils.fs import atomic_write_bytes
from .errors import DEPLOY_EXTRA_HINT, ExportError
from .graph import INPUT_NAME, OUTPUT_NAME, trace_graph
from .onnx_builder import CONST_TYPES, OnnxGraphBuilder
from .onnx_ops import convert_op
from .prepare import prepare_for_export
from .preprocess_info import encode_info

__all__ = ["OPSET", "IR_VERSION", "import_onnx", "graph_to_onnx", "export_onnx"]

OPSET, IR_VERSION = 17, 8


def import_onnx():
    """The `onnx` module, or ExportError saying how to install it."""
    try:
        import onnx
        import onnx.numpy_helper  # noqa: F401 - used through onnx.numpy_helper
    except ImportError as e:
        raise ExportError(f"ONNX export needs the onnx package ({e}): {DEPLOY_EXTRA_HINT}") from None
    return onnx


def _value_info(onnx, name, dtype, dims):
    return onnx.helper.make_tensor_value_info(name, onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), dims)


def graph_to_onnx(traced, opset=OPSET, metadata=None):
    """ModelProto of a TracedGraph (checked with onnx.checker, full_check); `metadata` (preprocess_info's dict)
    becomes its metadata_props."""
    onnx = import_onnx()
    network = traced.network()
    b = OnnxGraphBuilder(onnx)
    b.reserve(INPUT_NAME)
    b.reserve(OUTPUT_NAME)
    for opr in network.all_oprs:
        if opr.type == "Host2DeviceCopy":
            b.bind(opr.outputs[0], INPUT_NAME)
        elif opr.type not in CONST_TYPES and id(opr) not in b.absorbed:
            convert_op(b, opr)
    out_var = network.output_vars[0]
    result = b.name(out_var)
    b.nodes.append(onnx.helper.make_node("Identity", [result], [OUTPUT_NAME], name="logits/Identity"))
    n, c, h, w = traced.input_shape
    hw = ["height", "width"] if traced.spatial_free else [h, w]
    graph = onnx.helper.make_graph(
        b.nodes, "basebn", [_value_info(onnx, INPUT_NAME, np.float32, ["batch", c, *hw])],
        [_value_info(onnx, OUTPUT_NAME, out_var.dtype, ["batch", *tuple(out_var.shape)[1:]])], b.initializers)
    model = onnx.helper.make_model(graph, producer_name="basebn", ir_version=IR_VERSION,
                                   opset_imports=[onnx.helper.make_opsetid("", opset)])
    if metadata:
        onnx.helper.set_model_props(model, encode_info(metadata))
    onnx.checker.check_model(model, full_check=True)
    return model


def export_onnx(model, path, input_shape, prepare=True, metadata=None):
    """Write `model` as an ONNX file at `path` for inputs shaped `input_shape` (N, C, H, W; N is free).

    With `prepare` the model first goes through prepare_for_export (the model itself is not changed);
    `metadata` (preprocess_info's dict) is stored in the file. Returns the TracedGraph it was converted from.
    """
    import_onnx()  # fail before the work when onnx is missing
    if prepare:
        model = prepare_for_export(model, np.zeros(input_shape, np.float32))
    traced = trace_graph(model, input_shape)
    proto = graph_to_onnx(traced, metadata=metadata)
    atomic_write_bytes(path, proto.SerializeToString())
    return traced
