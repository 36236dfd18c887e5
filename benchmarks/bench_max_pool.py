"""CPU benchmark: the ResNet stem's 3x3/2 max pool, forward + backward, MegEngine (what basebn trains with) vs PyTorch.

Issue N asked to replace MegEngine's max pool by oneDNN's "where it is slower"; this measures whether it is.
Each framework runs in its own process with the same thread count; rounds alternate (mge, torch), (torch, mge),
...; each process times `--reps` fwd+bwd calls after warm-up and prints its median; the table gives the median
over rounds and the ratio mge/torch.

    .venv/bin/python benchmarks/bench_max_pool.py --torch-python .venv-bench/bin/python [--threads 1 2]
        [--shapes 32,64,56,56 8,64,112,112] [--rounds 3] [--reps 7]
"""
import argparse
import json
import statistics
import subprocess
import sys

from bench_train_step import thread_env

WORKER = r'''
import json, sys, time
import numpy as np
shape, reps, framework = tuple(int(v) for v in sys.argv[1].split(",")), int(sys.argv[2]), sys.argv[3]
x0 = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
if framework == "torch":
    import torch
    torch.set_num_threads(int(sys.argv[4]))
    x = torch.tensor(x0, requires_grad=True)
    def step():
        y = torch.nn.functional.max_pool2d(x, 3, 2, 1)
        y.backward(torch.ones_like(y))
        x.grad.sum().item()
        x.grad = None
else:
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
for _ in range(2):
    step()
times = []
for _ in range(reps):
    t0 = time.perf_counter()
    step()
    times.append((time.perf_counter() - t0) * 1e3)
print("@@" + json.dumps(sorted(times)[len(times) // 2]))
'''


def run_one(python, framework, shape, threads, reps):
    """Median ms of one process's fwd+bwd calls."""
    out = subprocess.run([python, "-c", WORKER, shape, str(reps), framework, str(threads)], env=thread_env(threads),
                         capture_output=True, text=True, check=True).stdout
    return json.loads(next(line for line in out.splitlines() if line.startswith("@@"))[2:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--torch-python", required=True, help="a python with torch")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--shapes", nargs="+", default=["32,64,56,56", "8,64,112,112"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    pythons = {"mge": sys.executable, "torch": args.torch_python}
    print("| shape (N,C,H,W) | threads | MegEngine ms | PyTorch ms | MegEngine / PyTorch |")
    print("|---|---|---|---|---|")
    for shape in args.shapes:
        for threads in args.threads:
            times = {"mge": [], "torch": []}
            for r in range(args.rounds):
                for fw in (("mge", "torch") if r % 2 == 0 else ("torch", "mge")):
                    times[fw].append(run_one(pythons[fw], fw, shape, threads, args.reps))
            m, t = statistics.median(times["mge"]), statistics.median(times["torch"])
            print(f"| {shape} | {threads} | {m:.1f} | {t:.1f} | {m / t:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
