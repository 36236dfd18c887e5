"""python -m basebn.tools.summary NAME [--input 224] [--num-classes 1000] [--in-channels 3] [--json]

Prints a model's parameter count, multiply-accumulates (MACs) for one image, the output shape of
each top-level stage and a signature of its state-dict layout (sha256 of the sorted key/shape
list), from one 1-image forward in eval mode with forward hooks. MACs count convs
(out_h * out_w * out_channels * in_channels / groups * kh * kw) and linear layers (in * out);
norms, activations, pooling and additions are not counted (as pycls / fvcore report "flops").
"""
import argparse
import difflib
import hashlib
import json
import sys
from typing import Any, Dict

import numpy as np

import megengine as mge
import megengine.module as M

from ..cli import quiet_device_probe
from ..config import ConfigError
from ..engine.build import check_input_size
from ..models import build_model, list_models, model_info
from ..utils.cli_args import MAX_CHANNELS, MAX_CLASSES, MAX_IMAGE_SIZE, OneLineArgumentParser, bounded_int
from ..utils.env_vars import EnvVarError, check_environment

__all__ = ["conv_macs", "linear_macs", "count_params", "state_dict_sha256", "summarize", "unknown_model_message",
           "build_parser", "main"]


def conv_macs(conv: M.Module, output: mge.Tensor) -> int:
    """MACs of Conv2d `conv` producing `output` (N, C, H, W), per image.

    Args:
        conv: the conv.
        output: its output.
    """
    _, cout, h, w = output.shape
    cin_per_group, kh, kw = conv.weight.shape[-3:]
    return int(h * w * cout * cin_per_group * kh * kw)


def linear_macs(linear: M.Module, output: mge.Tensor) -> int:
    """MACs of Linear `linear` producing `output` (N, ..., out), per image.

    Args:
        linear: the Linear layer.
        output: its output.
    """
    rows = int(np.prod(output.shape[1:-1])) if output.ndim > 2 else 1
    return int(rows * linear.in_features * linear.out_features)


def count_params(model: M.Module) -> int:
    """Number of parameters (not buffers) of `model`.

    Args:
        model: the model.
    """
    return int(sum(p.size for p in model.parameters()))


def state_dict_sha256(model: M.Module) -> str:
    """sha256 of the JSON list of sorted [key, shape] pairs of `model`'s state dict: equal for two models
    whose checkpoints load into each other key for key.

    Args:
        model: the model.

    Returns:
        The hex digest.
    """
    items = sorted([k, [int(d) for d in v.shape]] for k, v in model.state_dict().items())
    return hashlib.sha256(json.dumps(items).encode()).hexdigest()


def _shape(out):
    return tuple(out.shape) if isinstance(out, mge.Tensor) else None


def summarize(model: M.Module, input_size: int, in_channels: int = 3) -> Dict[str, Any]:
    """Parameters, MACs and output shapes of `model` for one image. `model`'s train/eval flags are restored.

    Args:
        model: the model.
        input_size: the image's height and width.
        in_channels: the image's channels.

    Returns:
        ``dict(params, macs, input, stages, layers, state_dict_sha256)``: stages = [(child name, output
        shape)], layers = [(name, "conv" or "linear", MACs)].
    """
    names = {id(m): n for n, m in model.named_modules()}
    layers, stages, handles = [], [], []

    def on_layer(module, inputs, output):
        kind = "conv" if isinstance(module, M.Conv2d) else "linear"
        macs = conv_macs(module, output) if kind == "conv" else linear_macs(module, output)
        layers.append((names[id(module)], kind, macs))

    def on_stage(module, inputs, output):
        stages.append((names[id(module)], _shape(output)))

    for _, m in model.named_modules():
        if isinstance(m, (M.Conv2d, M.Linear)):
            handles.append(m.register_forward_hook(on_layer))
    for name, child in model.named_children():
        handles.append(child.register_forward_hook(on_stage))
    flags = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        model(mge.tensor(np.zeros((1, in_channels, input_size, input_size), np.float32)))
    finally:
        for h in handles:
            h.remove()
        for m, flag in flags:
            m.training = flag
    return dict(params=count_params(model), macs=sum(m for _, _, m in layers), input=(1, in_channels, input_size,
                input_size), stages=stages, layers=layers, state_dict_sha256=state_dict_sha256(model))


def _human(n):
    for unit, scale in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.3f} {unit}"
    return str(n)


def _print(name, info, out):
    out.write(f"{name}: input {info['input']}\n")
    out.write(f"  parameters  {info['params']:,} ({_human(info['params'])})\n")
    out.write(f"  MACs        {info['macs']:,} ({_human(info['macs'])})\n")
    out.write(f"  state dict  sha256 {info['state_dict_sha256'][:16]}... (sorted key/shape list)\n")
    out.write("  stage outputs:\n")
    for stage, shape in info["stages"]:
        out.write(f"    {stage:<12} {shape}\n")


def unknown_model_message(name):
    """`unknown model NAME` with the closest names (or a few examples) and where the list is."""
    names = list_models()
    close = difflib.get_close_matches(str(name), names, n=4, cutoff=0.6)
    hint = f"did you mean {', '.join(close)}?" if close else f"e.g. {', '.join(names[:4])}"
    return f"unknown model {name!r}: {hint} (python -m basebn.tools.summary --list prints all {len(names)})"


def build_parser():
    """The argument parser: one-line errors, every number range-checked."""
    p = OneLineArgumentParser(prog="python -m basebn.tools.summary", description=__doc__.split("\n\n")[1],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", help="model name (see --list)", nargs="?")
    p.add_argument("--input", type=bounded_int(8, MAX_IMAGE_SIZE), default=None,
                   help="square input size in px (default: the model's)")
    p.add_argument("--num-classes", type=bounded_int(1, MAX_CLASSES), default=1000,
                   help="classifier outputs (default 1000)")
    p.add_argument("--in-channels", type=bounded_int(1, MAX_CHANNELS), default=3,
                   help="input image channels (default 3)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--list", action="store_true", help="list the model names and exit")
    return p


def main(argv=None, out=None):
    """The command line (see the module docstring); writes to `out` (default stdout), returns the exit code."""
    out = out or sys.stdout
    try:
        check_environment()
    except EnvVarError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    p = build_parser()
    args = p.parse_args(argv)
    if args.list or not args.name:
        out.write("\n".join(list_models()) + "\n")
        return 0
    if args.name not in list_models():
        print(f"error: {unknown_model_message(args.name)}", file=sys.stderr)
        return 2
    quiet_device_probe()  # MegEngine's CPU banner and `failed to load cuda func` lines
    size = args.input or model_info(args.name)["input_size"]
    model = build_model(args.name, num_classes=args.num_classes, in_channels=args.in_channels)
    try:
        check_input_size(model, (args.in_channels, size, size), f"{args.name} (--input {size})")
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    info = summarize(model, size, args.in_channels)
    if args.json:
        info = dict(info, name=args.name, layers=len(info["layers"]))
        out.write(json.dumps(info) + "\n")
    else:
        _print(args.name, info, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
