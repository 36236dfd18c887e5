"""Experiment: BN, Batch Renormalization, GroupNorm, ghost BN and SyncBN on non-i.i.d. small batches.

    .venv/bin/python experiments/bn_noniid_table.py [--seeds 42 43 44] [--jobs 2] --results results/bn_noniid.json

Ioffe 2017 (Batch Renormalization, section 4.2) builds each training batch from same-label examples and shows BN's
eval-mode accuracy falling while BRN keeps most of it. Here: Fashion-MNIST, ResNet-20 width 8 with the stride-2
stem, the first 8000 training images for one epoch (lr 0.4 per 128 images, scaled with the batch, cosine, warm-up a
tenth of the run), batch 8 and 32 per process, three samplings (``data.classes_per_batch`` /
``data.examples_per_class``): i.i.d.; pairs (same-label pairs, Ioffe's construction: 4 classes x 2 pairs at batch
8, 8 classes x 2 pairs at batch 32, since Fashion-MNIST has 10 classes, not 16); two classes per batch. Norms: BN,
BRN (r_max 3, d_max 5: plain BN for the first quarter of the run, relaxed over the next quarter), GN (the peers'
default 32 groups, capped at the channel count), ghost BN (batch 32 normalised in groups of 8) and SyncBN over 2
MPI ranks of ``batch`` each whose batches hold different classes (the sampler gives each rank its own classes).

Per run: top-1 of the final weights on the 10k test set (eval mode: running statistics), and the mode gap: on the
first 2000 test images batched by the run's own sampler (the same batch size, classes per batch and groups; for
SyncBN the two ranks' batches together), top-1 in train mode (batch statistics, as training saw them; running
statistics left as they are) minus top-1 in eval mode on the same images. Runs already finished are reused and an
interrupted run resumes, so an interrupted table continues where it stopped. ``--jobs 2`` trains two
single-process runs at a time, one thread each (SyncBN runs take both cores alone).
"""
import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import megengine as mge  # noqa: E402

from basebn.config import load_config  # noqa: E402
from basebn.data.sampler import class_batch_indices  # noqa: E402
from basebn.engine.build import build_data, build_model_from_cfg  # noqa: E402
from basebn.layers.batch_renorm import set_renorm_limits  # noqa: E402
from basebn.layers.norm import is_bn  # noqa: E402
from basebn.models import load_weights  # noqa: E402
from benchmarks.results_file import add_results_argument, save_run  # noqa: E402
from seed_runs import mpiexec, seed_summary  # noqa: E402

CONFIG = os.path.join(ROOT, "configs", "fmnist_resnet20.py")
TRAIN_IMAGES, EPOCHS = 8000, 1
DIAG_IMAGES = 2000
BATCHES = (8, 32)
SAMPLINGS = ("i.i.d.", "pairs", "2 classes")
NORMS = ("BN", "BRN", "GN", "ghost BN 8", "SyncBN 2 ranks")


def sampling_keys(sampling, batch):
    """(data.classes_per_batch, data.examples_per_class) of a sampling at a batch size."""
    if sampling == "i.i.d.":
        return 0, None
    if sampling == "pairs":
        return min(batch // 2, 8), 2
    return 2, None


def configurations():
    """[(batch, sampling, norm, overrides, processes)], ghost BN only where it has groups to split (batch 32)."""
    out = []
    for batch in BATCHES:
        for sampling in SAMPLINGS:
            k, m = sampling_keys(sampling, batch)
            data = [f"data.classes_per_batch={k}", f"data.examples_per_class={m}"]
            base = [f"batch_size={batch}", f"solver.basic_lr={0.4 * batch / 128}"] + data
            norms = {
                "BN": ([], 1),
                "BRN": (["model.norm='BRN'", f"bn.renorm.warmup_epochs={EPOCHS / 4}",
                         f"bn.renorm.ramp_epochs={EPOCHS / 4}"], 1),
                "GN": (["model.norm='GN'"], 1),
                "ghost BN 8": (["bn.norm_batch_size=8"], 1),
                "SyncBN 2 ranks": (["model.norm='SyncBN'"], 2),
            }
            for norm in NORMS:
                if norm == "ghost BN 8" and batch <= 8:
                    continue
                extra, procs = norms[norm]
                out.append((batch, sampling, norm, base + extra, procs))
    return out


def run_dir(args, batch, sampling, norm, seed):
    name = f"b{batch}-{sampling.replace(' ', '').replace('.', '')}-{norm.replace(' ', '')}"
    return os.path.join(args.out, name, f"seed{seed}")


def full_overrides(overrides, seed, out):
    return overrides + [f"seed={seed}", f"solver.max_epoch={EPOCHS}", f"solver.warmup_epochs={EPOCHS / 10}",
                        "model.base_width=8", f"data.max_train_samples={TRAIN_IMAGES}", "model_ema.enabled=False",
                        f"output_dir={out!r}", "eval_every_n_epoch=inf", "log_every_n_iter=200",
                        "test_batch_size=500"]


def train_and_measure(task, args):
    """Train one run (skipped when finished, resumed when interrupted), then its mode gap (skipped when recorded)."""
    batch, sampling, norm, overrides, procs, seed = task
    out = run_dir(args, batch, sampling, norm, seed)
    full = full_overrides(overrides, seed, out)
    threads = "1" if procs > 1 or args.jobs > 1 else str(os.cpu_count())
    env = {**os.environ, "OMP_NUM_THREADS": threads, "BASEBN_NUM_THREADS": threads}
    if not os.path.isfile(os.path.join(out, "final.npz")):
        cmd = [sys.executable, "-m", "basebn.train", CONFIG, *full]
        if procs > 1:
            cmd = [mpiexec(), "-n", str(procs)] + cmd
        if os.path.isdir(out):
            cmd.append("--resume")
        subprocess.run(cmd, cwd=ROOT, check=True, env=env, stdout=subprocess.DEVNULL)
    gap_file = os.path.join(out, "mode_gap.json")
    if not os.path.isfile(gap_file):
        subprocess.run([sys.executable, __file__, "--mode-gap", out, str(procs), *full], cwd=ROOT, check=True,
                       env=env)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        top1 = [json.loads(line) for line in f if line.strip()][-1]["top1"]
    with open(gap_file) as f:
        gap = json.load(f)
    return task, {"top1": top1, **gap}


def mode_gap(out, procs, overrides):
    """Writes OUT/mode_gap.json: top-1 in train mode and in eval mode on the same sampler-built test batches."""
    cfg = load_config(CONFIG, overrides)
    ds, loader = build_data(cfg.clone().merge({"test_batch_size": DIAG_IMAGES}), train=False)
    x, y = next(iter(loader))
    model = build_model_from_cfg(cfg, in_channels=ds.image_shape[0])
    load_weights(model, os.path.join(out, "final.npz"))
    if cfg.model.norm in ("BRN", "SyncBRN"):
        set_renorm_limits(model, cfg.bn.renorm.r_max, cfg.bn.renorm.d_max)
    for m in model.modules():
        if is_bn(m):
            m.momentum = 1.0  # running = 1.0 * running + 0 * batch: train-mode forwards leave them as they are
    k, m_ = cfg.data.classes_per_batch, cfg.data.examples_per_class
    if k:
        ranks = [class_batch_indices(y, cfg.batch_size, k, m_, cfg.seed, 0, r, procs).reshape(-1, cfg.batch_size)
                 for r in range(procs)]
        batches = np.concatenate(ranks, axis=1)
    else:
        perm = np.random.default_rng(cfg.seed).permutation(len(y))
        step = cfg.batch_size * procs
        batches = perm[:len(y) // step * step].reshape(-1, step)

    def accuracy(train):
        model.train(train)
        hits = 0
        for idx in batches:
            logits = model(mge.tensor(x[idx])).numpy()
            hits += int((logits.argmax(1) == y[idx]).sum())
        return 100.0 * hits / batches.size

    result = {"train_mode": accuracy(True), "eval_mode": accuracy(False), "images": int(batches.size)}
    with open(os.path.join(out, "mode_gap.json"), "w") as f:
        json.dump(result, f)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--mode-gap":
        return mode_gap(sys.argv[2], int(sys.argv[3]), sys.argv[4:])
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[42, 43, 44])
    p.add_argument("--jobs", type=int, choices=(1, 2), default=2)
    p.add_argument("--out", default=os.path.join(ROOT, "runs", "bn_noniid"))
    add_results_argument(p)
    args = p.parse_args()
    tasks = [c + (s,) for c in configurations() for s in args.seeds]
    start = time.time()
    done = {}
    single = [t for t in tasks if t[4] == 1]
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for task, res in pool.map(lambda t: train_and_measure(t, args), single):
            done[task[:3] + (task[5],)] = res
            print(f"{task[0]:>3} {task[1]:<10} {task[2]:<15} seed {task[5]}: {res}", flush=True)
    for task in (t for t in tasks if t[4] > 1):
        task, res = train_and_measure(task, args)
        done[task[:3] + (task[5],)] = res
        print(f"{task[0]:>3} {task[1]:<10} {task[2]:<15} seed {task[5]}: {res}", flush=True)
    figures = {}
    for batch, sampling, norm, _, _ in configurations():
        runs = [done[(batch, sampling, norm, s)] for s in args.seeds]
        gap = [r["train_mode"] - r["eval_mode"] for r in runs]
        figures.setdefault(f"batch {batch}", {}).setdefault(norm, {})[sampling] = {
            "top1": seed_summary([r["top1"] for r in runs]), "mode_gap": seed_summary(gap)}
    minutes = round((time.time() - start) / 60, 1)
    print(json.dumps(figures))
    conditions = (f"Fashion-MNIST, ResNet-20 width 8 (stride-2 stem), first {TRAIN_IMAGES} training images, "
                  f"{EPOCHS} epoch, lr 0.4 per 128 images, cosine; top-1 on the 10k test set (eval mode), mean "
                  f"[min, max] over seeds {' '.join(map(str, args.seeds))}; mode gap: train-mode minus eval-mode "
                  f"top-1 on the first {DIAG_IMAGES} test images in the run's own batches; {minutes} min with "
                  f"--jobs {args.jobs}")
    save_run(args.results, "experiments/bn_noniid_table.py", "table", [1 if args.jobs > 1 else os.cpu_count()],
             figures, "BN, BRN, GN, ghost BN and SyncBN on non-i.i.d. small batches (Fashion-MNIST)",
             conditions=conditions)


if __name__ == "__main__":
    main()
