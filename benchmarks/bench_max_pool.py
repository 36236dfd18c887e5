"""CPU benchmark: the ResNet stem's 3x3/2 max pool, forward + backward: basebn's max-pool ops, MegEngine's own
max pool (what evaluation and exports use) and PyTorch.

basebn's ops (basebn.layers.max_pool) replace MegEngine's max pool in CPU training, where MegEngine's is slower.
Each framework runs in its own process with the same thread count (`thread_env`: OMP/MKL/BASEBN
threads; MegEngine's own max pool runs on its default device, cpu0, one thread); rounds alternate the order
(basebn, mge, torch), (torch, mge, basebn), ...; each process times `--reps` fwd+bwd calls after warm-up and
prints its median; the table gives the median over rounds and the ratios basebn/torch, basebn/mge and mge/torch.

    .venv/bin/python benchmarks/bench_max_pool.py --torch-python .venv-bench/bin/python [--threads 1 2]
        [--shapes 32,64,56,56 8,64,112,112] [--rounds 3] [--reps 7] [--results results/max_pool.json]
"""
import argparse
import shlex
import sys

from op_process import alternating_medians
from results_file import add_results_argument, append_run, run_record, version_in

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
from basebn.ops import kernel_library
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

FRAMEWORKS = ("basebn", "mge", "torch")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--torch-python", required=True, help="a python with torch")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--shapes", nargs="+", default=["32,64,56,56", "8,64,112,112"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=7)
    add_results_argument(ap)
    args = ap.parse_args()
    rows = []
    pythons = {"basebn": sys.executable, "mge": sys.executable, "torch": args.torch_python}
    print("| shape (N,C,H,W) | threads | basebn ms | MegEngine ms | PyTorch ms | basebn / PyTorch | basebn / MegEngine "
          "| MegEngine / PyTorch |")
    print("|---|---|---|---|---|---|---|---|")
    for shape in args.shapes:
        for threads in args.threads:
            med = alternating_medians(pythons, {fw: SETUP + STEPS[fw] for fw in FRAMEWORKS}, shape, threads,
                                      args.rounds, args.reps)
            b, m, t = (med[fw] for fw in FRAMEWORKS)
            print(f"| {shape} | {threads} | {b:.1f} | {m:.1f} | {t:.1f} | {b / t:.2f}x | {b / m:.2f}x | {m / t:.2f}x |",
                  flush=True)
            rows.append({"shape (N,C,H,W)": shape, "threads": threads, "basebn ms": round(b, 1),
                         "MegEngine ms": round(m, 1), "PyTorch ms": round(t, 1), "basebn / PyTorch": round(b / t, 3),
                         "basebn / MegEngine": round(b / m, 3), "MegEngine / PyTorch": round(m / t, 3)})
    if args.results:
        record = run_record("pool", shlex.join(["benchmarks/bench_max_pool.py"] + sys.argv[1:]), args.threads,
                            {"fwd_bwd_ms": rows}, torch_version=version_in(args.torch_python, "torch"))
        append_run(args.results, record, "benchmarks/bench_max_pool.py",
                   "stem max pool 3x3/2 forward + backward: basebn's ops vs MegEngine's vs PyTorch's")


if __name__ == "__main__":
    main()
