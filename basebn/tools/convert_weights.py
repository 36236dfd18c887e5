"""python -m basebn.tools.convert_weights SPEC --arch NAME [-o OUT.npz] [--num-classes N] [--ema]

Converts weights from elsewhere (``basecls:PATH``, ``timm:PATH``, or any spec basebn reads) for model
NAME into basebn's pickle-free, checksummed .npz weights file; ``-w OUT.npz`` / ``model.weights=OUT.npz``
then load it. The conversion checks every key and shape against NAME built with N classes (default
1000: the classifier in the file must have that size). An existing OUT is never overwritten.
"""
import argparse
import os
import sys

from ..checkpoint import model_state, save_npz_weights
from ..cli import cli_main
from ..config import ConfigError
from ..models import build_model, list_models, load_weights
from ..utils.cli_args import MAX_CLASSES, OneLineArgumentParser, bounded_int

__all__ = ["convert", "build_parser", "main"]


def convert(spec: str, arch: str, out: str, num_classes: int = 1000, ema: bool = False) -> None:
    """Load `spec` into model `arch` and write its state to `out`.

    Args:
        spec: a weights spec (see :func:`basebn.models.load_weights`), e.g. ``timm:PATH`` or ``basecls:NAME``.
        arch: a model name (see :func:`basebn.models.list_models`).
        num_classes: the model's classes.
        out: the .npz weights file to write.
        ema: the checkpoint's EMA weights.
    """
    model = build_model(arch, num_classes=num_classes)
    load_weights(model, spec, ema=ema)
    save_npz_weights(out, model_state(model), meta={"arch": arch, "num_classes": num_classes, "source": spec})
    return out


def build_parser():
    """The argument parser."""
    p = OneLineArgumentParser(prog="python -m basebn.tools.convert_weights", description=__doc__.split("\n\n")[1],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spec", help="basecls:PATH (mge.save pickle), timm:PATH (.safetensors), or a basebn spec")
    p.add_argument("--arch", required=True, help="basebn model name the weights are for (e.g. resnet50d)")
    p.add_argument("-o", "--output", help="output .npz (default: ARCH.npz in the current directory)")
    p.add_argument("--num-classes", type=bounded_int(1, MAX_CLASSES), default=1000,
                   help="classifier size in the file (default 1000)")
    p.add_argument("--ema", action="store_true", help="take the file's EMA weights (basecls checkpoints)")
    return p


@cli_main
def main(argv=None):
    """Entry point; returns the exit code."""
    args = build_parser().parse_args(argv)
    if args.arch not in list_models():
        raise ConfigError(f"unknown --arch {args.arch!r}: give one of basebn.models.list_models() (e.g. resnet50d)")
    if args.num_classes < 1:
        raise ConfigError(f"--num-classes must be at least 1, got {args.num_classes}")
    out = args.output or f"{args.arch}.npz"
    if not out.endswith(".npz"):
        raise ConfigError(f"-o {out!r}: the output is an .npz weights file; give a name ending in .npz")
    if os.path.exists(out):
        raise ConfigError(f"{out!r} exists; give another -o or remove it first")
    convert(args.spec, args.arch, out, args.num_classes, args.ema)
    print(f"wrote {out} ({args.arch}, from {args.spec}); load it with -w {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
