"""python -m basebn.tools.plot RUN_DIR [RUN_DIR ...] [--out DIR] [--bn-stats] [--num-samples N]

Writes PNGs:
  curves.png    test loss, top-1 and EMA top-1 per epoch from each run's metrics.jsonl
  bn_stats.png  (--bn-stats, first run) per BN layer: how far the running statistics of the run's final
                weights (and of its EMA weights, if any) are from the population statistics precise BN
                would compute, so drift shows per layer
"""
import json
import os
import sys

import numpy as np

from ..cli import cli_main
from ..config import BaseConfig
from ..engine.build import build_data, build_model_from_cfg
from ..engine.metrics_log import metrics_path, read_metrics as read_metrics_file
from ..layers.precise_bn import collect_bn_population_stats
from ..models import load_weights
from ..utils.cli_args import MAX_SAMPLES, OneLineArgumentParser, bounded_int

__all__ = ["read_metrics", "plot_curves", "bn_drift", "plot_bn_stats", "main"]


def read_metrics(run_dir):
    """A run's metrics.jsonl rows (partial or corrupt lines dropped)."""
    path = metrics_path(run_dir)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} not found: is {run_dir!r} a basebn run directory?")
    return read_metrics_file(path)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_curves(run_dirs, out_path):
    """Test loss and top-1 per epoch of each run (EMA dashed) into `out_path`; returns the path."""
    plt = _pyplot()
    fig, (ax_loss, ax_top1) = plt.subplots(1, 2, figsize=(11, 4))
    for run in run_dirs:
        rows = read_metrics(run)
        label = os.path.basename(os.path.normpath(run))
        epochs = [r["epoch"] for r in rows]
        line, = ax_top1.plot(epochs, [r["top1"] for r in rows], marker="o", label=f"{label}")
        if any("ema_top1" in r for r in rows):
            ax_top1.plot(epochs, [r.get("ema_top1", np.nan) for r in rows], ls="--", color=line.get_color(),
                         label=f"{label} (EMA)")
        ax_loss.plot(epochs, [r["loss"] for r in rows], marker="o", color=line.get_color(), label=label)
    ax_loss.set(xlabel="epoch", ylabel="test loss", title="test loss")
    ax_top1.set(xlabel="epoch", ylabel="top-1 (%)", title="test top-1")
    for ax in (ax_loss, ax_top1):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_path, dpi=120)
    plt.close(fig)
    return out_path


def bn_drift(model, loader, num_samples):
    """Per BN layer: (name, mean shift / pop std, running var / pop var) averaged over channels."""
    pop = collect_bn_population_stats(model, loader, num_samples)
    modules = dict(model.named_modules())
    rows = []
    for name, (count, mean, var) in pop.items():
        m = modules[name]
        run_mean = np.asarray(m.running_mean).ravel()
        run_var = np.asarray(m.running_var).ravel()
        std = np.sqrt(np.maximum(var, 1e-12))
        rows.append((name, float(np.mean(np.abs(run_mean - mean) / std)),
                     float(np.mean(run_var / np.maximum(var, 1e-12)))))
    return rows


def plot_bn_stats(series, out_path, title=""):
    """series: {label: rows of bn_drift} (e.g. model and EMA), drawn as grouped bars per BN layer."""
    plt = _pyplot()
    if isinstance(series, list):
        series = {"weights": series}
    names = [r[0] for r in next(iter(series.values()))]
    x = np.arange(len(names))
    width = 0.8 / len(series)
    fig, (a, b) = plt.subplots(2, 1, figsize=(max(8, 0.4 * len(names)), 6.5), sharex=True)
    for i, (label, rows) in enumerate(series.items()):
        offset = (i - (len(series) - 1) / 2) * width
        a.bar(x + offset, [r[1] for r in rows], width, label=label)
        # bars start at 1 (no drift) so an over- or under-estimated variance shows as up or down
        b.bar(x + offset, [r[2] - 1.0 for r in rows], width, bottom=1.0, label=label)
    a.set(ylabel="|running mean − pop mean| / pop std",
          title=title or "BN running statistics vs population statistics (precise BN)")
    b.axhline(1.0, color="k", lw=0.8)
    b.set(ylabel="running var / pop var")
    b.set_xticks(x)
    b.set_xticklabels(names, rotation=90, fontsize=7)
    for ax in (a, b):
        ax.grid(axis="y", alpha=0.3)
        if len(series) > 1:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_path, dpi=120)
    plt.close(fig)
    return out_path


def _bn_series_for_run(run_dir, num_samples):
    """{"model": rows, "EMA": rows (when the run has EMA weights)} for the run's final weights."""
    with open(os.path.join(run_dir, "config.json")) as f:
        cfg = BaseConfig(json.load(f))
    ds, loader = build_data(cfg, train=True)
    series = {}
    for label, ema in (("model", False), ("EMA", True)):
        if ema and not cfg.model_ema.enabled:
            continue
        model = build_model_from_cfg(cfg, in_channels=ds.image_shape[0])
        load_weights(model, run_dir, ema=ema)
        loader.set_epoch(0)  # the same samples for both
        series[label] = bn_drift(model, loader, num_samples)
    return series


@cli_main
def main(argv=None):
    """CLI entry: draw curves.png (and bn_stats.png with --bn-stats); returns the exit code."""
    p = OneLineArgumentParser(prog="python -m basebn.tools.plot", description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories (each with metrics.jsonl)")
    p.add_argument("--out", default=None, help="output folder (default: the first run directory)")
    p.add_argument("--bn-stats", action="store_true", help="also plot BN drift of the first run's final weights")
    p.add_argument("--num-samples", type=bounded_int(1, MAX_SAMPLES), default=2048,
                   help="training samples for the population statistics of --bn-stats (default 2048)")
    args = p.parse_args(argv)
    out = args.out or args.runs[0]
    os.makedirs(out, exist_ok=True)
    try:
        print(plot_curves(args.runs, os.path.join(out, "curves.png")))
        if args.bn_stats:
            series = _bn_series_for_run(args.runs[0], args.num_samples)
            print(plot_bn_stats(series, os.path.join(out, "bn_stats.png"), title=os.path.basename(args.runs[0])))
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
