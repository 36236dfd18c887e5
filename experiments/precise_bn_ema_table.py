"""Experiment: what precise BN (pooled vs per-batch average) and EMA do to top-1, small batches.

    .venv/bin/python experiments/precise_bn_ema_table.py [--seeds 42 43] [--epochs 2] [--batch 16]

Trains ResNet-20 (width 8, stride-2 stem) on a Fashion-MNIST subset with a small batch and EMA on,
then evaluates, for each seed, the model and its EMA with: running statistics as trained, precise
BN pooled (basebn's default), precise BN batch_average (pycls/basecls/mmpretrain). Prints a markdown
table of mean top-1 over seeds (and the spread) - the table in the README comes from this script.
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
from variants import evaluate_variants  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", type=int, nargs="+", default=[42, 43])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--train-samples", type=int, default=8000)
    p.add_argument("--precise-samples", type=int, default=4096)
    p.add_argument("--out", default=os.path.join(ROOT, "runs", "precise_bn_ema"))
    args = p.parse_args()
    rows = [run_seed(s, args) for s in args.seeds]
    print(f"\nFashion-MNIST, ResNet-20 w8, batch {args.batch}, {args.train_samples} train samples, "
          f"{args.epochs} epochs, {len(args.seeds)} seeds; top-1 on the 10k test set (mean ± half-range)\n")
    print("| weights | running stats | precise BN, pooled (basebn) | precise BN, batch average (pycls) |")
    print("|---|---|---|---|")
    for which in ("model", "ema"):
        cells = []
        for method in ("running", "pooled", "batch_average"):
            v = np.array([r[(which, method)] for r in rows])
            cells.append(f"{v.mean():.2f} ± {(v.max() - v.min()) / 2:.2f}")
        print(f"| {'EMA' if which == 'ema' else 'model'} | " + " | ".join(cells) + " |")
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
        print(f"| {label} | " + " | ".join(cells) + " |")
    for label, method in (("EMA vs model, running stats", "running"), ("EMA vs model, precise BN pooled", "pooled")):
        d = np.array([r[("ema", method)] - r[("model", method)] for r in rows])
        print(f"| {label} | {d.mean():+.2f} [{d.min():+.2f}, {d.max():+.2f}] | |")
    for r, s in zip(rows, args.seeds):
        print(f"seed {s}: " + ", ".join(f"{w}/{m} {v:.2f}" for (w, m), v in r.items()))


if __name__ == "__main__":
    main()
