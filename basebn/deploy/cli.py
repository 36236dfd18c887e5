"""python -m basebn.deploy CONFIG.py|RUN_DIR|zoo:NAME [-w WEIGHTS] [--ema] --format mge|onnx -o OUT [--force]
       [--input-size S] [--verify] [--threads N] [KEY=VALUE ...]
python -m basebn.deploy --info FILE.onnx|FILE.mge

Builds the model and weights as basebn.test does (a run directory or its config.json: the run's config, and
without -w its final weights), exports it (prepare_for_export, then a .mge graph or
ONNX) for images shaped like the config's test set (or S x S), and with --verify runs the file on a
batch of test images and fails when the max abs difference to the eager model exceeds 1e-4 times
max(1, the largest |eager logit|). An existing OUT is replaced only with --force, and only by a file that
was written completely (and verified, with --verify); it keeps its permission bits. The file carries what it
expects (preprocess_info.py: mean, std, channel order, input size, resize and crop, class names), printed
after the export; --info prints it from an exported file (exit 2 for a file without it).
"""
import argparse
import os
import shutil
import stat
import sys
import tempfile

import numpy as np
from loguru import logger

from ..cli import cli_main
from ..config import run_dir_of
from ..engine.build import check_input_size, load_trained, resolve_config
from ..engine.logging import setup_logging
from .errors import ExportError
from .mge_export import export_mge
from .onnx_export import export_onnx
from .preprocess_info import describe_preprocess, preprocess_info, read_preprocess_info
from .runtime import compare_with_eager

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
    p.add_argument("config", nargs="?", help="experiment file, a run directory or its config.json (the run's "
                                              "config; its weights without -w), or zoo:NAME to export a zoo entry "
                                              "with its own config")
    p.add_argument("overrides", nargs="*", help="KEY=VALUE config overrides (e.g. data.root=...)")
    p.add_argument("-w", "--weights", help="checkpoint file, run directory or zoo:NAME")
    p.add_argument("--ema", action="store_true", help="export the EMA weights")
    p.add_argument("--format", choices=sorted(FORMATS), help="mge (MegEngine Lite) or onnx (required to export)")
    p.add_argument("-o", "--output", help="file to write (.mge or .onnx; required to export)")
    p.add_argument("--force", action="store_true", help="replace OUT when it exists")
    p.add_argument("--input-size", type=int, help="square image size to export for (default: the test set's)")
    p.add_argument("--verify", action="store_true", help="run the file and compare it with the eager model")
    p.add_argument("--threads", type=int, help="runtime threads for --verify (default: the runtime's own)")
    p.add_argument("--info", metavar="FILE", help="print what an exported .onnx/.mge file expects, and nothing else")
    args = p.parse_intermixed_args(argv)
    exporting = [name for name, given in (("CONFIG", args.config), ("--format", args.format),
                                          ("-o", args.output)) if given]
    if args.info is not None and (exporting or args.overrides or args.weights):
        p.error(f"--info FILE reads a file and exports nothing: drop {(exporting or ['KEY=VALUE / -w'])[0]}")
    missing = [name for name in ("CONFIG", "--format", "-o") if name not in exporting]
    if args.info is None and missing:
        p.error(f"the following arguments are required: {', '.join(missing)} (or --info FILE)")
    return args


def _check_args(args):
    ext = {"mge": ".mge", "onnx": ".onnx"}[args.format]
    if not args.output.lower().endswith(ext):
        raise ExportError(f"--format {args.format} writes a {ext} file: name the output {args.output!r} ...{ext}")
    if args.input_size is not None and args.input_size < 1:
        raise ExportError(f"--input-size must be a positive number of pixels, got {args.input_size}")
    if args.threads is not None and args.threads < 1:
        raise ExportError(f"--threads must be at least 1, got {args.threads}")
    if os.path.isdir(args.output):
        raise ExportError(f"-o {args.output!r} is a directory; name the file to write")
    if os.path.lexists(args.output) and not args.force:
        raise ExportError(f"-o {args.output!r} exists; pass --force to replace it, or give another -o")


def _verify(model, path, loader, input_shape, threads):
    """Raise ExportError unless the file at `path` gives the eager model's logits within the relative bound."""
    images = verify_batch(loader, input_shape)
    diff, scale = compare_with_eager(model, path, images, threads=threads)
    bound = VERIFY_TOLERANCE * scale
    if not diff <= bound:
        raise ExportError(f"verification failed: max abs difference {diff:.3g} > {bound:.3g} ({VERIFY_TOLERANCE:g} x "
                          f"largest |logit| {scale:.3g}) between the exported file and the eager model "
                          f"({len(images)} images); nothing was written")
    logger.info(f"verified: max abs difference {diff:.3g} <= {bound:.3g} ({VERIFY_TOLERANCE:g} x largest |logit| "
                f"{scale:.3g}) on {len(images)} images")


def _install(tmp_file, output):
    """Move the finished `tmp_file` to `output`; a replaced file's permission bits are kept."""
    mode = stat.S_IMODE(os.stat(output).st_mode) if os.path.isfile(output) else None
    os.replace(tmp_file, output)
    if mode is not None:
        os.chmod(output, mode)


@cli_main
def main(argv=None):
    """CLI entry: build, load, export, optionally verify; returns the exit code."""
    args = _parse(argv)
    if args.info is not None:
        return _print_info(args.info)
    _check_args(args)
    setup_logging(None)
    cfg, weights = resolve_config(args.config, args.overrides, args.weights or run_dir_of(args.config))
    model, ds, loader = load_trained(cfg, weights, ema=args.ema)
    c, h, w = ds.image_shape
    if args.input_size:
        h = w = args.input_size
        check_input_size(model, (c, h, w), cfg.model.name)
    info = preprocess_info(cfg, ds, loader, (c, h, w), weights=weights, ema=args.ema)
    # written and verified beside OUT, then moved over it: a failed export or verification leaves OUT as it was
    out_dir = os.path.dirname(os.path.abspath(args.output))
    os.makedirs(out_dir, exist_ok=True)
    work = tempfile.mkdtemp(prefix=".basebn-deploy-", dir=out_dir)
    try:
        tmp_file = os.path.join(work, os.path.basename(args.output))
        traced = FORMATS[args.format](model, tmp_file, (2, c, h, w), metadata=info)
        if args.verify:
            _verify(model, tmp_file, loader, (c, h, w), args.threads)
        _install(tmp_file, args.output)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    size = "free" if traced.spatial_free else f"{h}x{w}"
    logger.info(f"wrote {args.output} ({os.path.getsize(args.output) / 1e6:.1f} MB): input data (batch, {c}, "
                f"{h}, {w}), image size {size}, output logits")
    print(describe_preprocess(info), flush=True)
    return 0


def _print_info(path):
    """--info: the metadata block of an exported file; ExportError (one line, exit 2) when it has none."""
    info = read_preprocess_info(path)
    if not info:
        raise ExportError(f"{path} carries no basebn metadata (exported by another tool or an older basebn): "
                          f"export it again with python -m basebn.deploy to record what it expects")
    print(describe_preprocess(info), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
