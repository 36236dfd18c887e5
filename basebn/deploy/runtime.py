"""Run an exported file: a .mge graph in MegEngine Lite or in MegEngine's GraphInference, an .onnx file
in onnxruntime; and compare it with the eager model.

The backend follows the file's extension unless named (``lite`` is the default for .mge). `threads`
None keeps each runtime's default (Lite: 1 thread, onnxruntime: one per core).
"""
import os

import numpy as np

import megengine as mge
from megengine.utils.comp_graph_tools import GraphInference

from .errors import DEPLOY_EXTRA_HINT, ExportError
from .graph import INPUT_NAME, OUTPUT_NAME, load_network

__all__ = ["BACKENDS", "ExportedModel", "load_exported", "run_exported", "eager_logits", "max_abs_difference",
           "reference_scale", "compare_with_eager"]

BACKENDS = {"lite": ".mge", "megengine": ".mge", "onnxruntime": ".onnx"}  # backend -> file extension


def _default_backend(path):
    ext = os.path.splitext(path)[1].lower()
    for backend, backend_ext in BACKENDS.items():
        if ext == backend_ext:
            return backend
    raise ExportError(f"{path!r}: an exported model is a .mge or .onnx file")


class ExportedModel:
    """A loaded exported file: call it on a float32 (N, C, H, W) array to get the logits (numpy).

    `input_shape` / `output_shape`: the file's declared (N, C, H, W) / (N, classes), None for a free dimension
    (ONNX) or the shape it was traced at (.mge graphs; their batch size is free all the same).
    """

    def __init__(self, path, backend=None, threads=None):
        if not os.path.isfile(path):
            raise ExportError(f"no exported model at {path!r}: write one with python -m basebn.deploy")
        self.path, self.backend, self.threads = path, backend or _default_backend(path), threads
        if self.backend not in BACKENDS:
            raise ExportError(f"unknown backend {self.backend!r}: use one of {', '.join(BACKENDS)}")
        if not path.lower().endswith(BACKENDS[self.backend]):
            raise ExportError(f"backend {self.backend} runs {BACKENDS[self.backend]} files, not {path!r}")
        self.input_shape = self.output_shape = None
        self._run = getattr(self, f"_load_{self.backend}")()
        if self.input_shape is None:  # a .mge graph: the shapes of its input and output vars
            with open(path, "rb") as f:
                network = load_network(f.read())
            self.input_shape = tuple(network.input_vars[0].shape)
            self.output_shape = tuple(network.output_vars[0].shape)

    def check_data(self, image_shape, num_classes):
        """ExportError, before anything runs, when the file takes images of another channel count (or of another
        fixed size) than `image_shape` (C, H, W), or gives another number of classes than `num_classes`."""
        want_c, got_c = image_shape[0], self.input_shape[1]
        if got_c is not None and got_c != want_c:
            raise ExportError(f"{self.path} takes {got_c}-channel images, the test data has {want_c} channel(s): "
                              f"evaluate it on the data it was exported for (or export the model again)")
        fixed = [(got, want) for got, want in zip(self.input_shape[2:], image_shape[1:]) if got is not None]
        if self.backend == "onnxruntime" and any(got != want for got, want in fixed):
            raise ExportError(f"{self.path} takes {self.input_shape[2]}x{self.input_shape[3]} images, the test data "
                              f"is {image_shape[1]}x{image_shape[2]}: export it with --input-size or resize the data")
        got_k = self.output_shape[-1]
        if got_k is not None and got_k != num_classes:
            raise ExportError(f"{self.path} gives {got_k} class scores, the config has num_classes={num_classes}: "
                              f"evaluate it with the config it was trained with")

    def __call__(self, images):
        return self._run(np.ascontiguousarray(images, dtype=np.float32))

    def _load_lite(self):
        from megenginelite import LiteNetwork

        net = LiteNetwork()
        if self.threads:
            net.threads_number = int(self.threads)
        net.load(self.path)

        def run(images):
            net.get_io_tensor(INPUT_NAME).set_data_by_copy(images)
            net.forward()
            net.wait()
            return net.get_io_tensor(OUTPUT_NAME).to_numpy().copy()
        return run

    def _load_megengine(self):
        with open(self.path, "rb") as f:
            graph = GraphInference(f)
        return lambda images: graph.run(inp_dict={INPUT_NAME: images})[OUTPUT_NAME]

    def _load_onnxruntime(self):
        try:
            import onnxruntime
        except ImportError as e:
            raise ExportError(f"running ONNX needs onnxruntime ({e}): {DEPLOY_EXTRA_HINT}") from None
        options = onnxruntime.SessionOptions()
        if self.threads:
            options.intra_op_num_threads = int(self.threads)
        options.inter_op_num_threads = 1
        options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
        session = onnxruntime.InferenceSession(self.path, options, providers=["CPUExecutionProvider"])
        self.input_shape, self.output_shape = (tuple(d if isinstance(d, int) else None for d in io.shape)
                                               for io in (session.get_inputs()[0], session.get_outputs()[0]))
        return lambda images: session.run([OUTPUT_NAME], {INPUT_NAME: images})[0]


def load_exported(path, backend=None, threads=None):
    """An ExportedModel for `path` (load once, call many times)."""
    return ExportedModel(path, backend, threads)


def run_exported(path, images, threads=None, backend=None):
    """Logits of the exported file `path` on `images` (float32 N, C, H, W)."""
    return load_exported(path, backend, threads)(images)


def eager_logits(model, images):
    """Logits of the eager `model` in eval mode on `images` (its train/eval flags are restored)."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        return model(mge.tensor(np.asarray(images, np.float32))).numpy()
    finally:
        for m, training in modes:
            m.training = training


def max_abs_difference(model, path, images, threads=None, backend=None):
    """max |eager eval logits - exported file's logits| on `images`."""
    return compare_with_eager(model, path, images, threads=threads, backend=backend)[0]


def reference_scale(reference):
    """max(1, max |reference|): what a tolerance is multiplied by, so that a bound on float32 rounding holds for
    logits of any magnitude (an absolute 1e-4 is below one float32 step for values above ~1e3)."""
    reference = np.asarray(reference, np.float64)
    return max(1.0, float(np.max(np.abs(reference)))) if reference.size else 1.0


def compare_with_eager(model, path, images, threads=None, backend=None):
    """(max |eager logits - exported logits|, reference_scale(eager logits)) on `images`: --verify passes when
    the first is at most its tolerance times the second."""
    expected = eager_logits(model, images)
    got = run_exported(path, images, threads=threads, backend=backend)
    if got.shape != expected.shape:
        raise ExportError(f"{path}: logits of shape {got.shape}, the eager model gives {expected.shape}")
    return float(np.max(np.abs(got.astype(np.float64) - expected))), reference_scale(expected)
