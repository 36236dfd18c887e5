"""python -m basebn.test CONFIG.py -w WEIGHTS [--ema] [--json] [KEY=VALUE ...]
   python -m basebn.test zoo:NAME [--ema] [--json]

WEIGHTS is a checkpoint file (.npz, or a legacy .pkl), a run directory (its final weights) or zoo:NAME.
"""
import argparse
import json
import sys

import megengine as mge
from loguru import logger

from . import distributed as dist
from .cli import cli_main
from .config import ConfigError, load_config
from .engine.build import build_data, build_model_from_cfg, example_input, zoo_config
from .engine.evaluate import evaluate
from .engine.logging import setup_logging
from .models import load_weights
from .layers import enable_efficient_conv_bn_eval
from .models.weights import zoo_name

__all__ = ["test", "main"]


def test(cfg, weights, ema=False):
    """Evaluate `weights` on the test split of cfg's dataset; returns {'top1', 'top5', 'loss', 'images'}."""
    dist.init("auto")
    ds, loader = build_data(cfg, train=False)
    model = build_model_from_cfg(cfg, in_channels=ds.image_shape[0])
    load_weights(model, weights, ema=ema)
    if cfg.bn.efficient_conv_bn_eval:
        enable_efficient_conv_bn_eval(model, example_input=mge.tensor(example_input(ds)))
    return evaluate(model, loader, desc="test")


def _parse(argv):
    p = argparse.ArgumentParser(prog="python -m basebn.test", description=__doc__.split("\n")[0])
    p.add_argument("config", help="experiment file, or zoo:NAME to evaluate a zoo entry with its own config")
    p.add_argument("overrides", nargs="*", help="KEY=VALUE config overrides (e.g. data.root=...)")
    p.add_argument("-w", "--weights", help="checkpoint file, run directory or zoo:NAME")
    p.add_argument("--ema", action="store_true", help="evaluate the EMA weights")
    p.add_argument("--json", action="store_true", help='print a last line {"top1":..,"top5":..,"loss":..,"images":..}')
    return p.parse_intermixed_args(argv)


@cli_main
def main(argv=None):
    """CLI entry: parse argv, evaluate, print the metrics (and a JSON line with --json); returns the exit code."""
    args = _parse(argv)
    setup_logging(None)
    if zoo_name(args.config) is not None:
        cfg, weights = zoo_config(zoo_name(args.config), args.overrides), args.config
    else:
        if not args.weights:
            raise ConfigError("no weights: pass -w CHECKPOINT|RUN_DIR|zoo:NAME")
        cfg, weights = load_config(args.config, args.overrides), args.weights
    m = test(cfg, weights, ema=args.ema)
    logger.info(f"{weights}{' (EMA)' if args.ema else ''}: top1 {m['top1']:.2f} top5 {m['top5']:.2f} "
                f"loss {m['loss']:.4f} on {m['images']} images")
    if args.json and dist.is_main_process():
        print(json.dumps(m))
    return 0


if __name__ == "__main__":
    sys.exit(main())
