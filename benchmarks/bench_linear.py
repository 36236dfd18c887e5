"""CPU benchmark: a classifier's Linear layer, forward + backward: basebn's Linear (oneDNN sgemm op),
megengine.module.Linear (MegEngine's MatrixMul, one thread: what basebn trained with before) and PyTorch.

Both MegEngine processes start as basebn.train does (tune_cpu_runtime, the inline CPU device with its
OpenMP spin). Each framework runs in its own process with the same thread count (`thread_env`); rounds alternate
the order (basebn, mge, torch), (torch, mge, basebn), ...; each process times `--reps` fwd+bwd calls (input,
weight and bias gradients) after warm-up and prints its median; the table gives the median over rounds.

    .venv/bin/python benchmarks/bench_linear.py --torch-python .venv-bench/bin/python [--threads 1 2]
        [--shapes 32,1280,1000 32,512,1000 128,64,10] [--rounds 3] [--reps 15] [--results results/linear.json]
"""
import argparse
import sys

from op_process import alternating_medians
from results_file import add_results_argument, save_run

SETUP = r'''
import json, sys, time
import numpy as np
(batch, fan_in, fan_out), reps, threads = (int(v) for v in sys.argv[1].split(",")), int(sys.argv[2]), int(sys.argv[3])
rng = np.random.default_rng(0)
x0 = rng.standard_normal((batch, fan_in)).astype(np.float32)
dy0 = rng.standard_normal((batch, fan_out)).astype(np.float32)
'''

MEGENGINE = r'''
from basebn.utils.cpu_runtime import tune_cpu_runtime, use_inline_cpu_device
tune_cpu_runtime()
use_inline_cpu_device(omp_spin=True)
import megengine as mge
import megengine.module as M
from megengine.autodiff import GradManager
from basebn.layers import Linear
from basebn.ops import kernel_library
if not kernel_library.conv_kernel_available():
    sys.exit(f"basebn's oneDNN ops are unavailable: {kernel_library.conv_kernel_error()}")
fc = {layer}(fan_in, fan_out)
fc.train()
x, dy = mge.Parameter(x0), mge.tensor(dy0)
gm = GradManager().attach([x] + list(fc.parameters()))
def step():
    with gm:
        gm.backward(fc(x), dy)
    fc.weight.grad.sum().item()
    x.grad = fc.weight.grad = fc.bias.grad = None
'''

STEPS = {
    "torch": r'''
import torch
torch.set_num_threads(threads)
fc = torch.nn.Linear(fan_in, fan_out)
x, dy = torch.tensor(x0, requires_grad=True), torch.tensor(dy0)
def step():
    fc(x).backward(dy)
    fc.weight.grad.sum().item()
    x.grad = fc.weight.grad = fc.bias.grad = None
''',
    "mge": MEGENGINE.replace("{layer}", "M.Linear"),
    "basebn": MEGENGINE.replace("{layer}", "Linear"),
}

FRAMEWORKS = ("basebn", "mge", "torch")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--torch-python", required=True, help="a python with torch")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--shapes", nargs="+", default=["32,1280,1000", "32,512,1000", "128,64,10"],
                    help="batch,in,out: MobileNetV2's and ResNet-18's classifiers at batch 32, ResNet-20's at 128")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=15)
    add_results_argument(ap)
    args = ap.parse_args()
    rows = []
    pythons = {"basebn": sys.executable, "mge": sys.executable, "torch": args.torch_python}
    print("| batch, in, out | threads | basebn ms | MegEngine ms | PyTorch ms | basebn / PyTorch "
          "| basebn / MegEngine |")
    print("|---|---|---|---|---|---|---|")
    for shape in args.shapes:
        for threads in args.threads:
            med = alternating_medians(pythons, {fw: SETUP + STEPS[fw] for fw in FRAMEWORKS}, shape, threads,
                                      args.rounds, args.reps)
            b, m, t = (med[fw] for fw in FRAMEWORKS)
            print(f"| {shape} | {threads} | {b:.2f} | {m:.2f} | {t:.2f} | {b / t:.2f}x | {b / m:.2f}x |", flush=True)
            rows.append({"batch, in, out": shape.replace(",", ", "), "threads": threads, "basebn ms": round(b, 2),
                         "MegEngine ms": round(m, 2), "PyTorch ms": round(t, 2), "basebn / PyTorch": round(b / t, 3),
                         "basebn / MegEngine": round(b / m, 3)})
    save_run(args.results, "benchmarks/bench_linear.py", "linear", args.threads, {"fwd_bwd_ms": rows},
             "a Linear layer's forward + backward (input, weight and bias gradients): basebn's oneDNN sgemm op vs "
             "MegEngine's matmul vs PyTorch", conditions=f"medians of {args.rounds} alternating rounds of "
             f"{args.reps} calls", torch_python=args.torch_python)


if __name__ == "__main__":
    main()
