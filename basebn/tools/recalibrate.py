"""python -m basebn.tools.recalibrate CONFIG|zoo:NAME -w WEIGHTS -o OUT.npz [KEY=VALUE ...]
       [--method pooled|batch_average] [--num-samples N] [--ema] [--force]

Re-estimates every BN layer's population statistics on the training split with the data settings of the
config and its KEY=VALUE overrides (e.g. data.image_size=36 to test at a larger size, FixRes-style; or after
fusing, pruning or any other edit of the weights) and writes the weights, new statistics included, to
OUT.npz (a basebn weights file: -w OUT.npz loads it). The pass is precise BN's (basebn.layers.update_bn_stats:
the model in train mode on training batches with their augmentation, statistics pooled exactly over
batches and ranks); weights are not changed. FrozenBatchNorm2d layers and BN layers with freeze=True keep
theirs. An existing OUT is never overwritten without --force.
"""
import argparse
import sys
from typing import Any, Dict

from loguru import logger

from .. import distributed as dist
from ..checkpoint import model_state, save_npz_weights
from ..cli import cli_main
from ..config import BaseConfig, ConfigError
from ..engine.build import build_model_from_cfg, build_precise_bn_data, check_input_size, resolve_config
from ..engine.logging import setup_logging
from ..layers import update_bn_stats
from ..layers.precise_bn import METHODS
from ..models import load_weights
from ..utils.cli_args import MAX_SAMPLES, OneLineArgumentParser, bounded_int
from ..utils.fs import new_file_problem

__all__ = ["recalibrate", "check_output", "build_parser", "main"]


def check_output(out: str, force: bool) -> None:
    """Refuse an output path that cannot or must not be written.

    Args:
        out: the .npz weights file to write.
        force: overwrite an existing file.

    Raises:
        ConfigError: (one line) `out` does not end in .npz, is a folder, exists without `force`, or its folder
            does not exist or cannot take a new file (utils.fs.new_file_problem).
    """
    problem = new_file_problem(out, force)
    if problem:
        raise ConfigError(f"-o {out!r}: {problem}")


def recalibrate(cfg: BaseConfig, weights: str, out: str, method: str = "pooled", num_samples: int = 8192,
                ema: bool = False) -> Dict[str, Any]:
    """Load `weights` into cfg's model, re-estimate its BN statistics on cfg's training data (precise BN's
    pass, batches of bn.precise_batch_size as in training) and write the model state to `out` (rank 0).

    Args:
        cfg: the config that builds the model and the training data.
        weights: a weights spec (see :func:`basebn.models.load_weights`).
        out: the .npz weights file to write.
        method: ``"pooled"`` or ``"batch_average"``.
        num_samples: training images to use over all ranks.
        ema: start from the checkpoint's EMA weights.

    Returns:
        update_bn_stats's summary.

    Raises:
        ConfigError: the pass saw no BN statistics to re-estimate.
    """
    dist.init("auto")
    ds, loader = build_precise_bn_data(cfg)
    model = build_model_from_cfg(cfg, in_channels=ds.image_shape[0])
    check_input_size(model, ds.image_shape, cfg.model.name)
    load_weights(model, weights, ema=ema)
    loader.set_epoch(0)  # a fixed, seeded sample order and augmentation
    summary = update_bn_stats(model, loader, num_samples=num_samples, method=method, progress=True)
    if summary["layers"] == 0:
        raise ConfigError(f"no BN statistics to re-estimate ({summary['samples']} samples; skipped: "
                          f"{summary['skipped'] or 'none'}); nothing written")
    if dist.is_main_process():
        c, h, w = ds.image_shape
        meta = {"source": str(weights) + (" (EMA)" if ema else ""), "recalibrated": method,
                "samples": int(summary["samples"]), "image_shape": [int(c), int(h), int(w)],
                "model": cfg.model.name, "num_classes": int(cfg.num_classes)}
        save_npz_weights(out, model_state(model), meta=meta)
    return summary


def build_parser():
    """The argument parser."""
    p = OneLineArgumentParser(prog="python -m basebn.tools.recalibrate", description=__doc__.split("\n\n")[1],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", help="experiment file, or zoo:NAME (its own config and weights)")
    p.add_argument("overrides", nargs="*", help="KEY=VALUE config overrides (e.g. data.image_size=36)")
    p.add_argument("-w", "--weights", help="checkpoint file, run directory or zoo:NAME (default for zoo:NAME: it)")
    p.add_argument("-o", "--output", required=True, help="output .npz weights file")
    p.add_argument("--method", default="pooled", choices=METHODS,
                   help="pooled (population variance, default) or batch_average (pycls's)")
    p.add_argument("--num-samples", type=bounded_int(1, MAX_SAMPLES), default=8192,
                   help="training samples to use (default 8192)")
    p.add_argument("--ema", action="store_true", help="recalibrate the checkpoint's EMA weights")
    p.add_argument("--force", action="store_true", help="overwrite an existing output file")
    return p


@cli_main
def main(argv=None):
    """Entry point; returns the exit code."""
    args = build_parser().parse_intermixed_args(argv)
    check_output(args.output, args.force)
    setup_logging(None)
    cfg, weights = resolve_config(args.config, args.overrides, args.weights)
    summary = recalibrate(cfg, weights, args.output, args.method, args.num_samples, args.ema)
    if dist.is_main_process():
        logger.info(f"wrote {args.output}: {summary['layers']} BN layer(s) re-estimated ({args.method}) from "
                    f"{summary['samples']} training samples; load it with -w {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
