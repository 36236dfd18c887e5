"""Shared by the deploy tests: models with non-trivial BN statistics, and exporting one traced graph to both
formats (the same code path export_mge / export_onnx take after prepare_for_export)."""
import numpy as np

import megengine as mge

from basebn.deploy import eager_logits, graph_to_onnx, trace_graph
from basebn.layers.norm import bn_layers
from basebn.layers.precise_bn import update_bn_stats
from basebn.utils.fs import atomic_write_bytes


def randomize_bn(model, seed=0, input_shape=None):
    """Give every BN random affine values and non-trivial running statistics (fresh ones are 0/1, which
    fusion hides): random ones, or with `input_shape` (C, H, W) the population statistics of random images
    (logits then stay of order 1, as in a trained model, in deep nets too)."""
    rng = np.random.default_rng(seed)
    for _, bn in bn_layers(model):
        for name, low, high in (("running_mean", -0.3, 0.3), ("running_var", 0.5, 2.0),
                                ("weight", 0.5, 1.5), ("bias", -0.3, 0.3)):
            t = getattr(bn, name, None)
            if t is not None:
                t._reset(mge.Tensor(rng.uniform(low, high, t.shape).astype(np.float32)))
    if input_shape is not None:
        batches = [images((8, *input_shape), seed=seed + i) for i in range(2)]
        update_bn_stats(model, batches, num_samples=None, progress=False)
    model.eval()
    return model


def export_both(prepared, tmp_path, input_shape):
    """(mge path, onnx path, TracedGraph) of `prepared` (prepare_for_export's copy of a model) traced once."""
    traced = trace_graph(prepared, input_shape)
    mge_path, onnx_path = str(tmp_path / "model.mge"), str(tmp_path / "model.onnx")
    atomic_write_bytes(mge_path, traced.optimized)
    atomic_write_bytes(onnx_path, graph_to_onnx(traced).SerializeToString())
    return mge_path, onnx_path, traced


def images(shape, seed=1):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def scaled_tolerance(model, x, tolerance):
    """`tolerance` times the largest |eager logit| on `x` when that is above 1 (float32 rounding grows with it)."""
    return tolerance * max(1.0, float(np.abs(eager_logits(model, x)).max()))
