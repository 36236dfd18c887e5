"""The SGD update of one training step: basebn's InplaceSGD vs MegEngine's own SGD vs PyTorch's SGD (foreach), on a
model's parameters.

    .venv/bin/python benchmarks/bench_sgd.py [--models resnet18 resnet20 mbnetv2_x100] [--threads 1 2] [--rounds 5]
        [--reps 10] [--torch-python PY]

Each step updates every parameter of the model (momentum 0.9, weight decay 5e-4 on the weights, 0 on norm
parameters and biases: param_groups) from fixed random gradients. The MegEngine runners alternate in one process,
A B then B A, each time ending with a value read back (queued work included); MegEngine's ops are single-threaded,
so its rows do not depend on --threads. PyTorch (``--torch-python``: a python with torch) runs in its own process
with the same parameter shapes and torch.set_num_threads, after the MegEngine rounds. Prints medians (ms) and ratios
to PyTorch's time; ``--results FILE`` (results/sgd.json) appends them. Why the update stays on MegEngine's ops:
results/sgd.json.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import megengine as mge  # noqa: E402
import megengine.optimizer as optim  # noqa: E402

from basebn.cli import quiet_device_probe  # noqa: E402
from basebn.engine.optimizer import InplaceSGD, param_groups  # noqa: E402
from basebn.models import build_model  # noqa: E402
from basebn.utils.cpu_runtime import use_inline_cpu_device  # noqa: E402
from results_file import add_results_argument, save_run  # noqa: E402

MODELS = {"resnet18": dict(num_classes=1000, in_channels=3, stem="imagenet"),
          "resnet20": dict(num_classes=10, in_channels=1), "mbnetv2_x100": dict(num_classes=1000, in_channels=3)}
LR, MOMENTUM, WD = 0.05, 0.9, 5e-4
RUNNERS = ("basebn InplaceSGD", "MegEngine SGD")

TORCH = r'''
import json, statistics, sys, time, torch
shapes, decay, threads, rounds, reps = json.loads(sys.argv[1])
torch.set_num_threads(threads)
torch.manual_seed(0)
ps = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
for p in ps:
    p.grad = torch.randn(p.shape)
opt = torch.optim.SGD([{"params": [p for p, d in zip(ps, decay) if d], "weight_decay": 5e-4},
                       {"params": [p for p, d in zip(ps, decay) if not d], "weight_decay": 0.0}], lr=0.05, momentum=0.9)
for _ in range(3):
    opt.step()
times = []
for _ in range(rounds * reps):
    t = time.perf_counter(); opt.step(); times.append(time.perf_counter() - t)
print(json.dumps(statistics.median(times) * 1e3))
'''


def megengine_runners(model):
    """name -> (optimizer, params) over copies of ``model``'s parameters with random gradients."""
    rng = np.random.default_rng(0)
    runners = {}
    for name in RUNNERS:
        groups = param_groups(model, WD)
        params = []
        for g in groups:
            g["params"] = [mge.Parameter(p.numpy()) for p in g["params"]]
            params += g["params"]
        cls = optim.SGD if name == "MegEngine SGD" else InplaceSGD
        runners[name] = (cls(groups, lr=LR, momentum=MOMENTUM), params)
    grads = [rng.standard_normal(p.shape).astype(np.float32) for p in runners[RUNNERS[0]][1]]
    for _, params in runners.values():
        for p, g in zip(params, grads):
            p.grad = mge.tensor(g)
    return runners


def time_step(opt, params, reps):
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        opt.step()
        params[0].numpy()
        params[-1].numpy()
        times.append(time.perf_counter() - t)
    return times


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["resnet18", "resnet20", "mbnetv2_x100"], choices=sorted(MODELS))
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--torch-python", help="a python with torch (PyTorch's SGD is skipped without it)")
    add_results_argument(ap)
    args = ap.parse_args()
    figures = {"ms": {"columns": list(RUNNERS) + ["torch.optim.SGD (foreach)"]}}
    quiet_device_probe()
    use_inline_cpu_device(omp_spin=True)
    print("model     thr  params      " + "  ".join(f"{n:>18}" for n in RUNNERS + ("PyTorch SGD",)))
    for key in args.models:
        model = build_model(key, **MODELS[key])
        shapes = [list(p.shape) for p in model.parameters()]
        decayed = {id(p) for p in param_groups(model, WD)[0]["params"]}
        decay = [id(p) in decayed for p in model.parameters()]
        runners = megengine_runners(model)
        for threads in args.threads:
            times = {name: [] for name in runners}
            order = list(runners)
            for r in range(args.rounds):
                for name in (order if r % 2 == 0 else order[::-1]):
                    opt, params = runners[name]
                    time_step(opt, params, 2)  # warm-up (and the first step's state creation)
                    times[name] += time_step(opt, params, args.reps)
            med = {name: statistics.median(t) * 1e3 for name, t in times.items()}
            torch_ms = None
            if args.torch_python:
                out = subprocess.run([args.torch_python, "-c", TORCH,
                                      json.dumps([shapes, decay, threads, args.rounds, args.reps])],
                                     capture_output=True, text=True, check=True,
                                     env=dict(os.environ, OMP_NUM_THREADS=str(threads)))
                torch_ms = json.loads(out.stdout.strip().splitlines()[-1])
            cells = [f"{med[n]:8.2f} ms" + (f" {med[n] / torch_ms:4.2f}x" if torch_ms else "") for n in runners]
            cells.append(f"{torch_ms:8.2f} ms" if torch_ms else "-")
            n_params = sum(int(np.prod(s)) for s in shapes)
            print(f"{key:9} {threads:3}  {n_params:>9}   " + "  ".join(f"{c:>18}" for c in cells), flush=True)
            figures["ms"].setdefault(key, {})[str(threads)] = [round(med[n], 2) for n in runners] + \
                ([round(torch_ms, 2)] if torch_ms else [])
            if torch_ms:
                figures.setdefault("inplace_over_torch", {}).setdefault(key, {})[str(threads)] = \
                    round(med[RUNNERS[0]] / torch_ms, 3)
    save_run(args.results, "benchmarks/bench_sgd.py", "sgd", args.threads, figures,
             "the SGD update over every parameter (momentum 0.9, weight decay): basebn's InplaceSGD vs MegEngine's "
             "SGD vs PyTorch's", conditions=f"medians of {args.rounds} rounds of {args.reps} steps",
             torch_python=args.torch_python)


if __name__ == "__main__":
    main()
