"""Experiment: what precise BN (pooled vs per-batch average) and EMA do to top-1, small batches.

    .venv/bin/python experiments/precise_bn_ema_table.py [--seeds 42 43] [--epochs 2] [--batch 16] [--results FILE]

Trains ResNet-20 (width 8, stride-2 stem) on a Fashion-MNIST subset with a small batch and EMA on,
then evaluates, for each seed, the model and its EMA with: running statistics as trained, precise
BN pooled (basebn's default), precise BN batch_average (pycls/basecls/mmpretrain). Prints a markdown
table of mean top-1 over seeds (and the spread) and the paired differences; ``--results
results/precise_bn_ema.json`` records them there (docs/figures.md shows its rows).
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from basebn.checkpoint import FINAL, find_checkpoint  # noqa: E402
from basebn.config import load_config  # noqa: E402
from basebn.train import train  # noqa: E402
from benchmarks.results_file import add_results_argument, default_threads, save_run  # noqa: E402
from variants import evaluate_variants  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WEIGHTS = {"model": "model", "ema": "EMA"}
METHODS = {"running": "running stats", "pooled": "precise BN, pooled (basebn)",
           "batch_average": "precise BN, batch average (pycls)"}


def run_seed(seed, args):
    out = os.path.join(args.out, f"seed{seed}")
    cfg = load_config(os.path.join(ROOT, "configs", "fmnist_resnet20.py"), [
        f"seed={seed}", f"batch_size={args.batch}", f"solver.max_epoch={args.epochs}", "solver.basic_lr=0.02",
        "model.base_width=8", f"data.max_train_samples={args.train_samples}", "model_ema.momentum=0.995",
        f"output_dir={out!r}", "eval_every_n_epoch=inf", "log_every_n_iter=100", "bn.efficient_conv_bn_eval=False",
    ])
    if find_checkpoint(out, FINAL) is None:
        train(cfg, resume=os.path.isdir(out))
    variants = [(w, m) for w in ("model", "ema") for m in ("running", "pooled", "batch_average")]
    return evaluate_variants(cfg, out, variants, args.precise_samples)


def difference(d):
    """{"mean", "min", "max", "seeds"} of paired differences, in top-1 points."""
    return {"mean": round(float(d.mean()), 2), "min": round(float(d.min()), 2), "max": round(float(d.max()), 2),
            "seeds": [round(float(a), 2) for a in d]}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", type=int, nargs="+", default=[42, 43])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--train-samples", type=int, default=8000)
    p.add_argument("--precise-samples", type=int, default=4096)
    p.add_argument("--out", default=os.path.join(ROOT, "runs", "precise_bn_ema"))
    add_results_argument(p)
    args = p.parse_args()
    rows = [run_seed(s, args) for s in args.seeds]
    print(f"\nFashion-MNIST, ResNet-20 w8, batch {args.batch}, {args.train_samples} train samples, "
          f"{args.epochs} epochs, {len(args.seeds)} seeds; top-1 on the 10k test set (mean ± half-range)\n")
    print("| weights | " + " | ".join(METHODS.values()) + " |")
    print("|---|---|---|---|")
    figures = {"top1": {}, "paired_differences_points": {}}
    for which in ("model", "ema"):
        cells = []
        for method in METHODS:
            v = np.array([r[(which, method)] for r in rows])
            cells.append(f"{v.mean():.2f} ± {(v.max() - v.min()) / 2:.2f}")
            figures["top1"].setdefault(WEIGHTS[which], {})[METHODS[method]] = {
                "mean": round(float(v.mean()), 2), "half_range": round(float(v.max() - v.min()) / 2, 2),
                "seeds": [round(float(a), 2) for a in v]}
        print(f"| {WEIGHTS[which]} | " + " | ".join(cells) + " |")
    print(f"\nPaired differences in top-1 points (same seed, same trained weights; mean over {len(rows)} seeds, "
          f"[min, max] over seeds)\n")
    print("| change | model | EMA |")
    print("|---|---|---|")
    for label, a, b in (("precise BN pooled vs running stats", "pooled", "running"),
                        ("precise BN batch average vs running stats", "batch_average", "running"),
                        ("pooled vs batch average", "pooled", "batch_average")):
        cells = []
        for which in ("model", "ema"):
            d = np.array([r[(which, a)] - r[(which, b)] for r in rows])
            cells.append(f"{d.mean():+.2f} [{d.min():+.2f}, {d.max():+.2f}]")
            figures["paired_differences_points"].setdefault(label, {})[WEIGHTS[which]] = difference(d)
        print(f"| {label} | " + " | ".join(cells) + " |")
    for label, method in (("EMA vs model, running stats", "running"), ("EMA vs model, precise BN pooled", "pooled")):
        d = np.array([r[("ema", method)] - r[("model", method)] for r in rows])
        print(f"| {label} | {d.mean():+.2f} [{d.min():+.2f}, {d.max():+.2f}] | |")
        # one column: the EMA minus the model, filed under "model" as the table's first column
        figures["paired_differences_points"][label] = {"model": difference(d)}
    for r, s in zip(rows, args.seeds):
        print(f"seed {s}: " + ", ".join(f"{w}/{m} {v:.2f}" for (w, m), v in r.items()))
    save_run(args.results, "experiments/precise_bn_ema_table.py", "table", default_threads(), figures,
             "precise BN and EMA on small batches (Fashion-MNIST)",
             conditions=f"ResNet-20 (width 8), {args.train_samples} Fashion-MNIST training images, batch {args.batch}, "
                        f"{args.epochs} epochs, EMA momentum 0.995, precise BN over {args.precise_samples} images; "
                        f"top-1 on the 10k test set, mean ± half-range over seeds {' '.join(map(str, args.seeds))}; "
                        "differences: mean [min, max]")


if __name__ == "__main__":
    main()
