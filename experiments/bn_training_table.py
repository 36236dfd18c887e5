"""Experiment: BN in training (docs/bn_training.md) on Fashion-MNIST, paired seeds; prints markdown tables.

    .venv/bin/python experiments/bn_training_table.py [--seeds 42 43 44] [--sections small large accum freeze]
    .venv/bin/python experiments/bn_training_table.py --sections small --results results/bn_training_small.json

``--results`` records one section's table (small, large or accum) in its results file, which the page renders
(scripts/experiment_tables.py); the freeze section only prints.

Sections (each configuration one `python -m basebn.train` run of ResNet-20 width 8, stride-2 stem, on the first
training images of the section's budget, evaluated on the 10k test set; runs already finished are reused; lr
0.4 per 128 images, scaled linearly with the batch, cosine, warm-up a tenth of the run; ~75 min on 2 cores):
  small   8000 images, 1 epoch. Batch 4 per process: BN, BRN, GN, SyncBN over 2 MPI ranks, against batch-32 BN
  large   30000 images, 2 epochs. Batch 512 (lr 0.8) with bn.norm_batch_size 512 / 128 / 32 / 8
  accum   30000 images, 1 epoch. 8 x 16 accumulation (bn.accumulation_aware on / off) vs one batch of 128: top-1
          and the drift of the running statistics from the precise-BN population statistics (mean |mean shift|
          / std over layers)
  freeze  30000 images, 3 epochs, the recipe's lr 0.1. bn.freeze_last_epochs 0 / 1 / 2 (precise BN before the
          freeze). At lr 0.4 the frozen epoch diverged (NaN in 9 steps at lr 0.1; the unfused model's gradients
          are the same, so it is the dynamics of training without batch statistics at that lr)
Paired differences against each section's reference: mean over seeds and [min, max].
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from basebn.checkpoint import FINAL, find_checkpoint  # noqa: E402
from basebn.config import load_config  # noqa: E402
from basebn.engine.bn_report import population_drift  # noqa: E402
from basebn.engine.build import build_data, build_model_from_cfg  # noqa: E402
from basebn.engine.metrics_log import metrics_path, read_metrics  # noqa: E402
from basebn.models import load_weights  # noqa: E402
from benchmarks.results_file import add_results_argument, default_threads, save_run  # noqa: E402
from seed_runs import mpiexec, seed_summary  # noqa: E402

CONFIG = os.path.join(ROOT, "configs", "fmnist_resnet20.py")


# (training images, epochs) per section: batch 4 is per-call-overhead bound (~70 ms a step), batch 512 is not
BUDGET = {"small": (8000, 1), "large": (30000, 2), "accum": (30000, 1), "freeze": (30000, 3)}


def _lr(batch):
    """solver.basic_lr for `batch` per process: 0.4 per 128 images (the total lr is basic_lr * world size)."""
    return 0.4 * batch / 128


def sections():
    """{section: (reference label, [(label, overrides, processes)])}."""
    e = BUDGET["small"][1]
    accum = ["batch_size=16", f"solver.basic_lr={_lr(128)}", "solver.accumulation_steps=8"]
    return {
        "small": ("BN, batch 32", [
            ("BN, batch 32", ["batch_size=32", f"solver.basic_lr={_lr(32)}"], 1),
            ("BN, batch 4", ["batch_size=4", f"solver.basic_lr={_lr(4)}"], 1),
            ("BRN, batch 4", ["batch_size=4", f"solver.basic_lr={_lr(4)}", "model.norm='BRN'",
                              f"bn.renorm.warmup_epochs={e / 4}", f"bn.renorm.ramp_epochs={e / 4}"], 1),
            ("GN, batch 4", ["batch_size=4", f"solver.basic_lr={_lr(4)}", "model.norm='GN'"], 1),
            ("SyncBN, 2 ranks x batch 4", ["batch_size=4", f"solver.basic_lr={_lr(4)}", "model.norm='SyncBN'"], 2),
        ]),
        "large": ("norm_batch_size 512", [
            (f"norm_batch_size {g}", ["batch_size=512", "solver.basic_lr=0.8", f"bn.norm_batch_size={g}"], 1)
            for g in (512, 128, 32, 8)]),
        "accum": ("one batch of 128", [
            ("one batch of 128", ["batch_size=128", f"solver.basic_lr={_lr(128)}"], 1),
            ("8 x 16, accumulation-aware", accum + ["bn.accumulation_aware=True"], 1),
            ("8 x 16, per micro-batch", accum + ["bn.accumulation_aware=False"], 1),
        ]),
        "freeze": ("freeze_last_epochs 0", [
            (f"freeze_last_epochs {n}", ["batch_size=128", "solver.basic_lr=0.1",
                                         f"bn.freeze_last_epochs={n}", "bn.precise_every_n_epoch=-1",
                                         "bn.num_samples_precise=4096"], 1)
            for n in (0, 1, 2)]),
    }


# the sections a results file records (results/bn_training_<section>.json): section -> its "what"
RECORDED = {"small": "BN, BRN, GN and SyncBN at batch 4 vs BN at batch 32 (Fashion-MNIST)",
            "accum": "gradient accumulation 8 x 16 vs one batch of 128: top-1 and running-statistics drift",
            "large": "one batch of 512 normalized in groups (bn.norm_batch_size 512 / 128 / 32 / 8)"}


def run(label, overrides, procs, seed, args, section):
    """Train one configuration (skipped when its final.npz exists); returns (top-1, output_dir, overrides)."""
    out = os.path.join(args.out, section, label.replace(" ", "_").replace(",", ""), f"seed{seed}")
    samples, epochs = BUDGET[section]
    full = overrides + [f"seed={seed}", f"solver.max_epoch={epochs}", f"solver.warmup_epochs={epochs / 10}",
                        "model.base_width=8", f"data.max_train_samples={samples}", "model_ema.enabled=False",
                        f"output_dir={out!r}", "eval_every_n_epoch=inf", "log_every_n_iter=200"]
    if find_checkpoint(out, FINAL) is None:
        cmd = [sys.executable, "-m", "basebn.train", CONFIG, *full]
        if procs > 1:
            cmd = [mpiexec(), "-n", str(procs)] + cmd
        if os.path.isdir(out):
            cmd.append("--resume")
        subprocess.run(cmd, cwd=ROOT, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"} if procs > 1 else None)
    rows = read_metrics(metrics_path(out))
    return rows[-1]["top1"], out, full


def drift(out, overrides, samples):
    """Mean over BN layers of |running mean - population mean| / population std (the BN-drift plot's shift)."""
    cfg = load_config(CONFIG, overrides)
    ds, loader = build_data(cfg, train=True)
    model = build_model_from_cfg(cfg, in_channels=ds.image_shape[0])
    load_weights(model, os.path.join(out, "final.npz"))
    loader.set_epoch(0)
    d = population_drift(model, loader, samples)
    return float(np.mean([v["mean_shift"] for v in d.values()]))


def _cell(values, fmt=".2f"):
    v = np.asarray(values)
    return f"{v.mean():{fmt}} [{v.min():{fmt}}, {v.max():{fmt}}]"


def _diff(values, ref):
    d = np.asarray(values) - np.asarray(ref)
    return f"{d.mean():+.2f} [{d.min():+.2f}, {d.max():+.2f}]"


def table(section, args):
    """Runs one section, prints its markdown table; returns its figures (the layout its results file holds)."""
    ref_label, configs = sections()[section]
    results = {}
    for label, overrides, procs in configs:
        results[label] = [run(label, overrides, procs, s, args, section) for s in args.seeds]
    with_drift = section == "accum"
    if with_drift:
        drifts = {label: [drift(out, ov, args.precise_samples) for _, out, ov in r] for label, r in results.items()}
    samples, epochs = BUDGET[section]
    print(f"\n### {section}: Fashion-MNIST, ResNet-20 w8, {samples} train samples, {epochs} epochs, "
          f"seeds {' '.join(map(str, args.seeds))}; top-1 on the 10k test set, mean [min, max]\n")
    head = "| configuration | top-1 | vs " + ref_label + " (paired) |" + (" running-stat drift |" if with_drift else "")
    print(head)
    print("|---" * (4 if with_drift else 3) + "|")
    ref = [r[0] for r in results[ref_label]]
    figures = {"reference": ref_label, "configurations": {}}
    for label, r in results.items():
        top1 = [x[0] for x in r]
        row = f"| {label} | {_cell(top1)} | {'-' if label == ref_label else _diff(top1, ref)} |"
        figures["configurations"][label] = entry = {"top1": seed_summary(top1)}
        if label != ref_label:
            entry["vs_reference"] = seed_summary(np.asarray(top1) - np.asarray(ref))
        if with_drift:
            row += f" {_cell(drifts[label], '.4f')} |"
            entry["drift"] = seed_summary(drifts[label], digits=4)
        print(row)
    return figures


def conditions(section, args):
    """What one section ran, in a line (the page prints it under the table)."""
    samples, epochs = BUDGET[section]
    extra = {"small": "batch 4 per process (the reference 32), lr 0.4 per 128 images scaled with the batch",
             "accum": f"drift from a precise-BN pass over {args.precise_samples} training images",
             "large": "batch 512, lr 0.8"}[section]
    return (f"Seeds {' '.join(map(str, args.seeds))}, paired; {samples} training images, {epochs} "
            f"epoch{'s' if epochs > 1 else ''}; {extra}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", type=int, nargs="+", default=[42, 43, 44])
    p.add_argument("--sections", nargs="+", default=["small", "large", "accum", "freeze"],
                   choices=["small", "large", "accum", "freeze"])
    p.add_argument("--precise-samples", type=int, default=2048)
    p.add_argument("--out", default=os.path.join(ROOT, "runs", "bn_training"))
    add_results_argument(p)
    args = p.parse_args()
    if args.results and (len(args.sections) != 1 or args.sections[0] not in RECORDED):
        p.error("--results records one section's table: give --sections small, large or accum with it")
    everything = {s: table(s, args) for s in args.sections}
    print("\n" + json.dumps(everything))
    if args.results:
        section = args.sections[0]
        save_run(args.results, "experiments/bn_training_table.py", "table", default_threads(), everything[section],
                 RECORDED[section], conditions=conditions(section, args))


if __name__ == "__main__":
    main()
