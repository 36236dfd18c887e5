"""Experiment: bn.freeze_last_epochs at the learning rate of the frozen epoch, against no freezing.

    .venv/bin/python experiments/bn_freeze_table.py [--seeds 42 43 44] --results results/bn_freeze.json

Wu & Johnson (2021, section 4) freeze BN for the last, low-lr epochs of a schedule. Here: Fashion-MNIST, ResNet-20
width 8 with the stride-2 stem, the first 12000 training images for 4 epochs at batch 128, each schedule run with
``bn.freeze_last_epochs`` 0 and 1 (precise BN on 4096 images before the freeze), the same seeds paired:
  step 1/100   lr 0.1, x0.1 at epochs 2 and 3: the frozen epoch runs at 0.001, 1/100 of the peak
  step 1/10    lr 0.1, x0.1 at epoch 3: the frozen epoch runs at 0.01, 1/10 of the peak
  cosine 0.1   lr 0.1 (the recipe's), cosine: the frozen epoch starts at 0.0146, 0.15 of the peak
  cosine 0.4   lr 0.4, cosine: the frozen epoch starts at 0.059
  cosine 0.1, 3 epochs  the first 30000 images for 3 epochs, lr 0.1, cosine: the frozen epoch starts at 0.025
A run that stops on a non-finite loss or on non-finite gradients (exit 1) counts as diverged; the table gives its
seeds and the frozen step where it stopped. Finished and diverged runs are reused, so an interrupted table continues.
"""
import argparse
import datetime
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from basebn.config import load_config  # noqa: E402
from basebn.engine.lr_schedule import frozen_lr_factor, peak_factor  # noqa: E402
from benchmarks.results_file import add_results_argument, save_run  # noqa: E402
from seed_runs import seed_summary  # noqa: E402

CONFIG = os.path.join(ROOT, "configs", "fmnist_resnet20.py")
TRAIN_IMAGES, EPOCHS, BATCH = 12000, 4, 128
SCHEDULES = {
    "step 1/100": ["solver.basic_lr=0.1", "solver.lr_schedule='step'", "solver.lr_decay_steps=(2, 3)"],
    "step 1/10": ["solver.basic_lr=0.1", "solver.lr_schedule='step'", "solver.lr_decay_steps=(3,)"],
    "cosine 0.1": ["solver.basic_lr=0.1", "solver.lr_schedule='cosine'"],
    "cosine 0.4": ["solver.basic_lr=0.4", "solver.lr_schedule='cosine'"],
    "cosine 0.1, 3 epochs": ["solver.basic_lr=0.1", "solver.lr_schedule='cosine'"],
}
BUDGETS = {"cosine 0.1, 3 epochs": (30000, 3)}  # (training images, epochs) where not TRAIN_IMAGES, EPOCHS
FREEZE = (0, 1)


def overrides(schedule, freeze, seed, out):
    images, epochs = BUDGETS.get(schedule, (TRAIN_IMAGES, EPOCHS))
    return SCHEDULES[schedule] + [
        f"bn.freeze_last_epochs={freeze}", "bn.precise_every_n_epoch=-1", "bn.num_samples_precise=4096",
        f"batch_size={BATCH}", f"seed={seed}", f"solver.max_epoch={epochs}", f"solver.warmup_epochs={epochs / 10}",
        "model.base_width=8", f"data.max_train_samples={images}", "model_ema.enabled=False",
        f"output_dir={out!r}", "eval_every_n_epoch=inf", "log_every_n_iter=10", "test_batch_size=500"]


def run_dir(schedule, freeze, seed, args):
    folder = schedule.replace(", ", "-").replace(" ", "").replace("/", "_")
    return os.path.join(args.out, folder, f"freeze{freeze}", f"seed{seed}")


def run(schedule, freeze, seed, args):
    """{"top1": float, "loss_before_freeze", "frozen_loss_peak"} of a finished run (the losses for freeze > 0), or
    {"diverged": frozen step or None} of one that stopped non-finite."""
    out = run_dir(schedule, freeze, seed, args)
    marker = os.path.join(out, "diverged.json")
    if os.path.isfile(marker):
        with open(marker) as f:
            return json.load(f)
    if not os.path.isfile(os.path.join(out, "final.npz")):
        cmd = [sys.executable, "-m", "basebn.train", CONFIG, *overrides(schedule, freeze, seed, out)]
        if os.path.isdir(out):
            cmd.append("--resume")
        done = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode == 1 and re.search(r"non-finite|NaN|inf", done.stderr):
            result = {"diverged": frozen_step_at_stop(out, freeze), "message": done.stderr.strip().splitlines()[-1]}
            with open(marker, "w") as f:
                json.dump(result, f)
            return result
        if done.returncode != 0:
            raise SystemExit(f"{out}: basebn.train exited {done.returncode}:\n{done.stderr[-2000:]}")
    with open(os.path.join(out, "metrics.jsonl")) as f:
        result = {"top1": [json.loads(line) for line in f if line.strip()][-1]["top1"]}
    if freeze:
        result["loss_before_freeze"], result["frozen_loss_peak"] = loss_jump(out, freeze)
    return result


def frozen_step_at_stop(out, freeze):
    """The 1-based step within the frozen epochs of the last iteration logged (every 10) before the stop (None: the
    stop came before the freeze)."""
    with open(os.path.join(out, "log.txt")) as f:
        found = re.findall(r"epoch (\d+)/(\d+) iter (\d+)/(\d+)", f.read())
    if not found or not freeze:
        return None
    epoch, epochs, it, per_epoch = map(int, found[-1])
    first_frozen = epochs - freeze + 1
    return (epoch - first_frozen) * per_epoch + it if epoch >= first_frozen else None


def loss_jump(out, freeze):
    """(last training loss logged before the freeze, highest logged in the frozen epochs), from OUT/log.txt."""
    with open(os.path.join(out, "log.txt")) as f:
        logged = [(int(e), int(n), float(loss)) for e, n, loss in
                  re.findall(r"epoch (\d+)/(\d+) iter \d+/\d+ loss ([0-9.eE+-]+|nan|inf)", f.read())]
    before = [loss for e, n, loss in logged if e <= n - freeze]
    frozen = [loss for e, n, loss in logged if e > n - freeze]
    return (before[-1] if before else None), (max(frozen) if frozen else None)


def run_minutes(out):
    """Wall minutes between the first and the last line of OUT/log.txt (one training run, resumes included)."""
    with open(os.path.join(out, "log.txt")) as f:
        stamps = re.findall(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)", f.read(), re.M)
    first, last = (datetime.datetime.fromisoformat(t) for t in (stamps[0], stamps[-1]))
    return (last - first).total_seconds() / 60


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[42, 43, 44])
    p.add_argument("--out", default=os.path.join(ROOT, "runs", "bn_freeze"))
    add_results_argument(p)
    args = p.parse_args()
    figures, minutes = {}, 0.0
    for schedule in SCHEDULES:
        results = {n: [run(schedule, n, s, args) for s in args.seeds] for n in FREEZE}
        minutes += sum(run_minutes(run_dir(schedule, n, s, args)) for n in FREEZE for s in args.seeds)
        row = {}
        for n, rs in results.items():
            finished = [r["top1"] for r in rs] if all("top1" in r for r in rs) else None
            row[f"freeze {n}"] = {
                "seeds": {str(s): r.get("top1", "diverged") for s, r in zip(args.seeds, rs)},
                "diverged_at_frozen_step": {str(s): r["diverged"] for s, r in zip(args.seeds, rs) if "diverged" in r},
                "loss_before_freeze_and_frozen_peak": {str(s): [r["loss_before_freeze"], r["frozen_loss_peak"]]
                                                       for s, r in zip(args.seeds, rs) if "frozen_loss_peak" in r},
                "top1": seed_summary(finished) if finished else None}
            print(schedule, n, row[f"freeze {n}"], flush=True)
        pairs = [(a["top1"], b["top1"]) for a, b in zip(results[1], results[0]) if "top1" in a and "top1" in b]
        row["paired_difference"] = seed_summary([a - b for a, b in pairs]) if pairs else None
        solver = load_config(CONFIG, overrides(schedule, 1, args.seeds[0], "unused")).solver
        row["frozen_epoch_lr"] = {"highest": round(solver.basic_lr * frozen_lr_factor(solver, 1), 5),
                                  "of_peak": round(frozen_lr_factor(solver, 1) / peak_factor(solver), 4)}
        figures[schedule] = row
    conditions = (f"Fashion-MNIST, ResNet-20 width 8 (stride-2 stem), first {TRAIN_IMAGES} training images, "
                  f"{EPOCHS} epochs (cosine 0.1, 3 epochs: 30000 images, 3 epochs), batch {BATCH}; top-1 on the 10k "
                  f"test set, seeds {' '.join(map(str, args.seeds))};"
                  f" paired difference: freeze 1 minus freeze 0, mean [min, max] over the seeds both finished; "
                  f"{minutes:.0f} min of training, summed over the runs' logs")
    print(json.dumps(figures))
    save_run(args.results, "experiments/bn_freeze_table.py", "table", [os.cpu_count()], figures,
             "bn.freeze_last_epochs against the lr of the frozen epoch (Fashion-MNIST)", conditions=conditions)


if __name__ == "__main__":
    main()
