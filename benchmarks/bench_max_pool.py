"""CPU benchmark: the ResNet stem's 3x3/2 max pool, forward + backward: basebn's max-pool ops, MegEngine's own
max pool (what basebn trained with before) and PyTorch.

Issue N asked to replace MegEngine's max pool where it is slower; basebn's ops (basebn.layers.max_pool) are the
replacement. Each framework runs in its own process with the same thread count (`thread_env`: OMP/MKL/BASEBN
threads; MegEngine's own max pool runs on its default device, cpu0, one thread); rounds alternate the order
(basebn, mge, torch), (torch, mge, basebn), ...; each process times `--reps` fwd+bwd calls after warm-up and
prints its median; the table gives the median over rounds and the ratios basebn/torch, basebn/mge and mge/torch.

    .venv/bin/python benchmarks/bench_max_pool.py --torch-python .venv-bench/bin/python [--threads 1 2]
        [--shapes 32,64,56,56 8,64,112,112] [--rounds 3] [--reps 7]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

from bench_train_step import thread_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SETUP = r'''
import json, sys, time
import numpy as np
shape, reps, threads = tuple(int(v) for v in sys.argv[1].split(",")), int(sys.argv[2]), int(sys.argv[3])
x0 = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
'''

STEPS = {
    "torch": r'''
import torch
torch.set_num_threads(threads)
x = torch.tensor(x0, requires_grad=True)
def step():
    y = torch.nn.functional.max_pool2d(x, 3, 2, 1)
    y.backward(torch.ones_like(y))
    x.grad.sum().item()
    x.grad = None
''',
    "mge": r'''
import megengine as mge
import megengine.functional as F
from megengine.autodiff import GradManager
x = mge.tensor(x0)
gm = GradManager().attach([x])
def step():
    with gm:
        y = F.max_pool2d(x, 3, 2, 1)
        gm.backward(y, F.ones_like(y))
    x.grad.sum().item()
    x.grad = None
''',
    "basebn": r'''
import megengine as mge
import megengine.functional as F
from megengine.autodiff import GradManager
from basebn.layers import kernel_library
from basebn.layers.max_pool import max_pool2d
if not kernel_library.conv_kernel_available():
    sys.exit(f"basebn's max-pool ops are unavailable: {kernel_library.conv_kernel_error()}")
x = mge.tensor(x0)
gm = GradManager().attach([x])
def step():
    with gm:
        y = max_pool2d(x, 3, 2, 1)
        gm.backward(y, F.ones_like(y))
    x.grad.sum().item()
    x.grad = None
''',
}

TIMING = r'''
for _ in range(2):
    step()
times = []
for _ in range(reps):
    t0 = time.perf_counter()
    step()
    times.append((time.perf_counter() - t0) * 1e3)
print("@@" + json.dumps(sorted(times)[len(times) // 2]))
'''

FRAMEWORKS = ("basebn", "mge", "torch")


def run_one(python, framework, shape, threads, reps):
    """Median ms of one process's fwd+bwd calls."""
    env = thread_env(threads)
    if framework == "basebn":  # this checkout's basebn
        env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    res = subprocess.run([python, "-c", SETUP + STEPS[framework] + TIMING, shape, str(reps), str(threads)], env=env,
                         capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"{framework} worker failed:\n{res.stderr[-2000:]}")
    return json.loads(next(line for line in res.stdout.splitlines() if line.startswith("@@"))[2:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--torch-python", required=True, help="a python with torch")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--shapes", nargs="+", default=["32,64,56,56", "8,64,112,112"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    pythons = {"basebn": sys.executable, "mge": sys.executable, "torch": args.torch_python}
    print("| shape (N,C,H,W) | threads | basebn ms | MegEngine ms | PyTorch ms | basebn / PyTorch | basebn / MegEngine "
          "| MegEngine / PyTorch |")
    print("|---|---|---|---|---|---|---|---|")
    for shape in args.shapes:
        for threads in args.threads:
            times = {fw: [] for fw in FRAMEWORKS}
            for r in range(args.rounds):
                for fw in (FRAMEWORKS if r % 2 == 0 else FRAMEWORKS[::-1]):
                    times[fw].append(run_one(pythons[fw], fw, shape, threads, args.reps))
            b, m, t = (statistics.median(times[fw]) for fw in FRAMEWORKS)
            print(f"| {shape} | {threads} | {b:.1f} | {m:.1f} | {t:.1f} | {b / t:.2f}x | {b / m:.2f}x | {m / t:.2f}x |",
                  flush=True)


if __name__ == "__main__":
    main()
