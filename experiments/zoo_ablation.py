"""The zoo ablation: what each BN technique does to top-1 on full Fashion-MNIST, paired by seed.

    .venv/bin/python experiments/zoo_ablation.py [--results results/zoo_ablation.json]   # after scripts/build_zoo.sh

Reads the run directories scripts/build_zoo.sh writes, evaluates every run's weights (model, and EMA when
the run has one) with running statistics and after precise BN (pooled, 8192 samples), caching the numbers
in each run directory (ablation.json), and prints a markdown table: each technique's top-1 and its delta
against the baseline of the same seed, with the number of seeds behind it. Missing runs are skipped.
``--results`` records the table in its results file, which docs/zoo.md renders (scripts/experiment_tables.py).
"""
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, HERE]

from basebn.config import BaseConfig  # noqa: E402
from benchmarks.results_file import add_results_argument, default_threads, save_run  # noqa: E402
from variants import evaluate_variants  # noqa: E402

PRECISE_SAMPLES = 8192
# run directory -> seed; the baseline of a seed is the model of the single-process run with that seed
RUNS = {"runs/fmnist_r20_s42": 42, "runs/fmnist_r20_ema_s43": 43, "runs/fmnist_r20_ema99_s44": 44,
        "runs/fmnist_r20_syncbn2_s42": 42, "runs/fmnist_finetune": 42, "runs/fmnist_r20_long_s42": 42,
        "runs/fmnist_r20_fullres_s42": 42, "runs/fmnist_r20_fullres_restart_s42": 42,
        "runs/fmnist_r20_fullres_restart2_s42": 42}
SINGLE = ("runs/fmnist_r20_s42", "runs/fmnist_r20_ema_s43", "runs/fmnist_r20_ema99_s44")
# longer or larger runs of the same recipe: run directory -> what they change
LONGER = (("runs/fmnist_r20_long_s42", "8 epochs instead of 3"),
          ("runs/fmnist_r20_fullres_s42", "full 28×28 resolution (stem stride 1), 7 epochs"),
          ("runs/fmnist_r20_fullres_restart_s42", "full resolution, 7 epochs + a 6-epoch warm restart (LR 0.05)"),
          ("runs/fmnist_r20_fullres_restart2_s42", "full resolution, 7 epochs + two 6-epoch warm restarts"))


def load_run(run_dir):
    import json

    with open(os.path.join(ROOT, run_dir, "config.json")) as f:
        cfg = BaseConfig(json.load(f))
    variants = [("model", "running"), ("model", "pooled")]
    if cfg.model_ema.enabled:
        variants += [("ema", "running"), ("ema", "pooled")]
    return cfg, evaluate_variants(cfg, os.path.join(ROOT, run_dir), variants, PRECISE_SAMPLES, "ablation.json")


def technique_figures(label, pairs, base):
    """One row's figures: its seeds, top-1 (mean, per seed) and, but for the baseline, the paired delta."""
    top1 = [v for _, v in pairs]
    out = {"seeds": [s for s, _ in pairs],
           "top1": {"mean": round(float(np.mean(top1)), 2), "by_seed": [round(float(v), 2) for v in top1]}}
    if not label.startswith("baseline"):
        delta = np.array([v - base[s] for s, v in pairs])
        out["vs_baseline"] = {"mean": round(float(delta.mean()), 2), "min": round(float(delta.min()), 2),
                              "max": round(float(delta.max()), 2), "by_seed": [round(float(d), 2) for d in delta]}
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_results_argument(p)
    args = p.parse_args()
    import megengine  # noqa: F401

    from basebn.distributed import init

    init("none")
    results = {}
    for run, seed in RUNS.items():
        # final.pkl: runs of older basebn versions
        if any(os.path.isfile(os.path.join(ROOT, run, name)) for name in ("final.npz", "final.pkl")):
            results[run] = load_run(run)
    base = {RUNS[r]: results[r][1][("model", "running")] for r in SINGLE if r in results}

    rows = []  # (technique, [(seed, top1)]), each compared with the baseline of the same seed

    def add(label, pairs):
        pairs = [(s, v) for s, v in pairs if s in base]
        if pairs:
            rows.append((label, pairs))

    add("baseline: BN, batch 128, running statistics", [(RUNS[r], results[r][1][("model", "running")])
                                                        for r in SINGLE if r in results])
    add("+ precise BN (pooled, 8192 samples)", [(RUNS[r], results[r][1][("model", "pooled")])
                                                for r in SINGLE if r in results])
    for r in SINGLE:
        if r in results and ("ema", "running") in results[r][1]:
            m = results[r][0].model_ema.momentum
            add(f"EMA (momentum {m})", [(RUNS[r], results[r][1][("ema", "running")])])
            add(f"EMA (momentum {m}) + precise BN", [(RUNS[r], results[r][1][("ema", "pooled")])])
    if "runs/fmnist_r20_syncbn2_s42" in results:
        add("SyncBN, 2 MPI ranks × 64 (same global batch)",
            [(42, results["runs/fmnist_r20_syncbn2_s42"][1][("model", "running")])])
    for run, label in LONGER:
        if run in results:
            cfg, res = results[run]
            add(label, [(RUNS[run], res[("model", "running")])])
            add(f"{label}, EMA (momentum {cfg.model_ema.momentum}) + precise BN",
                [(RUNS[run], res[("ema", "pooled")])])
    if "runs/fmnist_finetune" in results:
        add("fine-tune zoo:fmnist_r20 1 epoch, norm_eval + efficient conv-BN",
            [(42, results["runs/fmnist_finetune"][1][("model", "running")])])

    print("| technique | top-1 (mean) | Δ vs baseline (mean [min, max]) | seeds |")
    print("|---|---|---|---|")
    for label, pairs in rows:
        top1 = np.array([v for _, v in pairs])
        delta = np.array([v - base[s] for s, v in pairs])
        d = "—" if label.startswith("baseline") else (
            f"{delta.mean():+.2f}" + (f" [{delta.min():+.2f}, {delta.max():+.2f}]" if len(pairs) > 1 else ""))
        print(f"| {label} | {top1.mean():.2f} | {d} | {len(pairs)} ({', '.join(str(s) for s, _ in pairs)}) |")
    for run, (cfg, res) in results.items():
        print(f"{run}: " + ", ".join(f"{w}/{m} {v:.2f}" for (w, m), v in res.items()))
    figures = {"techniques": {label: technique_figures(label, pairs, base) for label, pairs in rows}}
    save_run(args.results, "experiments/zoo_ablation.py", "table", default_threads(), figures,
             "what each BN technique changes in the zoo's Fashion-MNIST runs (top-1, paired by seed)",
             conditions=f"Full Fashion-MNIST (60k train / 10k test), the runs of scripts/build_zoo.sh; precise BN "
                        f"pooled over {PRECISE_SAMPLES} training images; top-1 on the 10k test set, delta against "
                        "the baseline of the same seed")


if __name__ == "__main__":
    main()
