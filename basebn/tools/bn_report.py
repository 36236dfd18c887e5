"""python -m basebn.tools.bn_report WEIGHTS|RUN_DIR [CONFIG] [--data-samples N] [--json] [-o DIR]

BN health of trained weights, per BN layer: dead channels (|gamma| < 1e-3 or running var < eps), non-finite
buffers, the distance between the running statistics and the population statistics of N training samples
(mean shift in sigma units, variance ratio: the numbers of the BN-drift plot; needs CONFIG, or a run
directory's config.json), model-vs-EMA drift when the checkpoint holds EMA weights, and a verdict ("precise
BN recommended: 7 of 21 layers drift > 5%"). Prints the table (with --json, a last line of JSON) and writes
bn_report.txt, bn_report.json and bn_report.png (matplotlib, the optional 'plot' extra) to DIR (default:
the run directory, else the current directory: never beside a weights file, which may lie in the shipped zoo
folder) and says where.
"""
import argparse
import json
import os
import sys
from typing import Any, Dict, Optional, Tuple

import numpy as np

from .. import distributed as dist
from ..checkpoint import CheckpointError, load_checkpoint, resolve_weights
from ..cli import cli_main
from ..config import BaseConfig, ConfigError
from ..engine.bn_report import build_report, ema_drift, format_table, plot_report, population_drift, report_json
from ..engine.build import build_data, build_model_from_cfg, resolve_config
from ..engine.logging import setup_logging
from ..layers.norm import bn_layers
from ..models import load_weights
from ..models.weights import read_weights, zoo_name
from ..utils.cli_args import MAX_SAMPLES, OneLineArgumentParser, bounded_int

__all__ = ["read_states", "run_config", "bn_report", "build_parser", "main"]


def read_states(spec: str) -> Tuple[Dict[str, np.ndarray], Optional[Dict[str, np.ndarray]]]:
    """The model state and the EMA state of a weights spec.

    Args:
        spec: a checkpoint / weights file, a run directory (its final, else latest, checkpoint) or zoo:NAME.

    Returns:
        (model state, EMA state or None); zoo:NAME has no EMA.
    """
    if zoo_name(spec) is not None:
        return read_weights(spec)[0], None
    payload = load_checkpoint(resolve_weights(spec))
    ema = payload.get("ema")
    return payload["model"], (ema or {}).get("module") or None


def run_config(spec: str, config: Optional[str]) -> Optional[BaseConfig]:
    """The config to build the model and the training data with.

    Args:
        spec: the weights spec.
        config: a config file or zoo:NAME; None: a zoo entry's own, else a run directory's config.json.

    Returns:
        The config, or None when there is none.
    """
    if config or zoo_name(spec) is not None:
        return resolve_config(config or spec, [], spec)[0]
    path = os.path.join(spec, "config.json")
    if os.path.isdir(spec) and os.path.isfile(path):
        with open(path) as f:
            return BaseConfig(json.load(f))
    return None


def _population(cfg, spec, num_samples):
    """(drift rows, {layer: eps}) of the weights built by cfg's model on num_samples of its training data."""
    dist.init("auto")
    ds, loader = build_data(cfg, train=True)
    model = build_model_from_cfg(cfg, in_channels=ds.image_shape[0])
    load_weights(model, spec)
    loader.set_epoch(0)
    return population_drift(model, loader, num_samples), {name: m.eps for name, m in bn_layers(model)}


def bn_report(spec: str, config: Optional[str] = None, data_samples: int = 2048) -> Dict[str, Any]:
    """The BN health report of weights `spec`.

    Args:
        spec: a checkpoint / weights file, a run directory or zoo:NAME.
        config: the config that builds the training data (see :func:`run_config`).
        data_samples: training images to compare the running statistics with; 0: none.

    Returns:
        The report dict (see :func:`basebn.engine.bn_report.build_report`).

    Raises:
        ConfigError: the weights hold no BN layer.
    """
    state, ema = read_states(spec)
    if not any(k.endswith(".running_var") for k in state):
        raise ConfigError(f"{spec!r} holds no BN layers (no *.running_mean / *.running_var arrays): nothing to "
                          f"report")
    cfg = run_config(spec, config)
    population, eps = None, None
    if cfg is not None and data_samples > 0:
        population, eps = _population(cfg, spec, data_samples)
    return build_report(state, eps=eps, population=population, ema=ema_drift(state, ema) if ema else None,
                        source=spec)


def _pyplot():
    """matplotlib's pyplot (Agg), or None when the optional 'plot' extra is not installed."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _out_dir(spec, out):
    """Where the report goes: -o, else a run directory itself, else the current directory."""
    if out:
        return os.path.abspath(out)
    return os.path.abspath(spec if os.path.isdir(spec) else os.curdir)


def _write(report, out_dir):
    """Write bn_report.txt / .json / .png into out_dir; returns the notes to print."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "bn_report.txt"), "w") as f:
        f.write(format_table(report) + "\n")
    with open(os.path.join(out_dir, "bn_report.json"), "w") as f:
        f.write(report_json(report) + "\n")
    plt = _pyplot()
    if plt is None:
        return [f"wrote {out_dir}/bn_report.txt and .json; no PNG: matplotlib is not installed "
                f"(pip install 'basebn[plot]')"]
    png = plot_report(report, os.path.join(out_dir, "bn_report.png"), plt)
    return [f"wrote {out_dir}/bn_report.txt, .json and {png}"]


def build_parser():
    """The argument parser."""
    p = OneLineArgumentParser(prog="python -m basebn.tools.bn_report", description=__doc__.split("\n\n")[1],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("weights", help="checkpoint / weights file, run directory, or zoo:NAME")
    p.add_argument("config", nargs="?", help="experiment file or zoo:NAME (a run directory has its own)")
    p.add_argument("--data-samples", type=bounded_int(0, MAX_SAMPLES), default=2048,
                   help="training samples for the population statistics (default 2048; 0: skip)")
    p.add_argument("--json", action="store_true", help="print the report as a last line of JSON")
    p.add_argument("-o", "--out", help="folder for bn_report.txt/.json/.png (default: the run directory, else the "
                                       "current directory)")
    return p


@cli_main
def main(argv=None):
    """Entry point; returns the exit code."""
    args = build_parser().parse_args(argv)
    if zoo_name(args.weights) is None and not os.path.exists(args.weights):
        raise CheckpointError(f"weights {args.weights!r} not found: give a checkpoint file, a run directory or "
                              f"zoo:NAME")
    setup_logging(None)
    report = bn_report(args.weights, args.config, args.data_samples)
    if not dist.is_main_process():
        return 0
    notes = _write(report, _out_dir(args.weights, args.out))
    print(format_table(report))
    for note in notes:
        print(note)
    if args.json:
        print(report_json(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
