"""python -m basebn.deploy CONFIG.py|zoo:NAME [-w WEIGHTS] [--ema] --format mge|onnx -o OUT [--input-size S]
       [--verify] [--threads N] [KEY=VALUE ...]

Builds the model and weights as basebn.test does, exports it (prepare_for_export, then a .mge graph or
ONNX) for images shaped like the config's test set (or S x S), and with --verify runs the file on a
batch of test images and fails above a max abs difference of 1e-4 to the eager model.
"""
import argparse
import os
import sys

import numpy as np
from loguru import logger

from ..cli import cli_main
from ..engine.build import load_trained, resolve_config
from ..engine.logging import setup_logging
from .errors import ExportError
from .mge_export import export_mge
from .onnx_export import export_onnx
from .runtime import max_abs_difference

__all__ = ["FORMATS", "VERIFY_TOLERANCE", "verify_batch", "main"]

FORMATS = {"mge": export_mge, "onnx": export_onnx}
VERIFY_TOLERANCE = 1e-4
_VERIFY_IMAGES = 16


def verify_batch(loader, input_shape):
    """Up to 16 test images shaped `input_shape` (C, H, W): the loader's first batch, or random normal
    values when the export size differs from the data's."""
    images = next(iter(loader))[0][:_VERIFY_IMAGES]
    if tuple(images.shape[1:]) == tuple(input_shape):
        return np.asarray(images, np.float32)
    return np.random.default_rng(0).standard_normal((_VERIFY_IMAGES, *input_shape)).astype(np.float32)


def _parse(argv):
    p = argparse.ArgumentParser(prog="python -m basebn.deploy", description=__doc__.split("\n")[0])
    p.add_argument("config", help="experiment file, or zoo:NAME to export a zoo entry with its own config")
    p.add_argument("overrides", nargs="*", help="KEY=VALUE config overrides (e.g. data.root=...)")
    p.add_argument("-w", "--weights", help="checkpoint file, run directory or zoo:NAME")
    p.add_argument("--ema", action="store_true", help="export the EMA weights")
    p.add_argument("--format", required=True, choices=sorted(FORMATS), help="mge (MegEngine Lite) or onnx")
    p.add_argument("-o", "--output", required=True, help="file to write (.mge or .onnx)")
    p.add_argument("--input-size", type=int, help="square image size to export for (default: the test set's)")
    p.add_argument("--verify", action="store_true", help="run the file and compare it with the eager model")
    p.add_argument("--threads", type=int, help="runtime threads for --verify (default: the runtime's own)")
    return p.parse_intermixed_args(argv)


def _check_args(args):
    ext = {"mge": ".mge", "onnx": ".onnx"}[args.format]
    if not args.output.lower().endswith(ext):
        raise ExportError(f"--format {args.format} writes a {ext} file: name the output {args.output!r} ...{ext}")
    if args.input_size is not None and args.input_size < 1:
        raise ExportError(f"--input-size must be a positive number of pixels, got {args.input_size}")


@cli_main
def main(argv=None):
    """CLI entry: build, load, export, optionally verify; returns the exit code."""
    args = _parse(argv)
    _check_args(args)
    setup_logging(None)
    cfg, weights = resolve_config(args.config, args.overrides, args.weights)
    model, ds, loader = load_trained(cfg, weights, ema=args.ema)
    c, h, w = ds.image_shape
    if args.input_size:
        h = w = args.input_size
    traced = FORMATS[args.format](model, args.output, (2, c, h, w))
    size = "free" if traced.spatial_free else f"{h}x{w}"
    logger.info(f"wrote {args.output} ({os.path.getsize(args.output) / 1e6:.1f} MB): input data (batch, {c}, "
                f"{h}, {w}), image size {size}, output logits")
    if args.verify:
        images = verify_batch(loader, (c, h, w))
        diff = max_abs_difference(model, args.output, images, threads=args.threads)
        if not diff <= VERIFY_TOLERANCE:
            os.remove(args.output)
            raise ExportError(f"verification failed: max abs difference {diff:.3g} > {VERIFY_TOLERANCE:g} between "
                              f"{args.output} and the eager model ({len(images)} images); the file was removed")
        logger.info(f"verified: max abs difference {diff:.3g} <= {VERIFY_TOLERANCE:g} on {len(images)} images")
    return 0


if __name__ == "__main__":
    sys.exit(main())
