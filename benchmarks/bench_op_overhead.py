"""CPU benchmark: the fixed cost of one call, basebn's custom ops vs a MegEngine built-in, tuned vs untuned runtime.

Ops on tiny tensors, so that the time is the call, not the arithmetic: basebn's oneDNN conv forward on a
1x1x1x1 input (conv_ops.conv_forward), basebn's BN statistics op on 2x1x2x2 (bn_ops.bn_stats), and MegEngine's
``x + 1``. Each runs ``--calls`` times back to back, then one ``_full_sync``; the figure is the wall time per call
(dispatch, MegEngine's queues, the custom-op boundary). Processes take turns round by round: ``tuned``
starts as basebn.train does (basebn.utils.cpu_runtime: tune_cpu_runtime's capped spin and kept malloc, then
use_inline_cpu_device), ``cpu0`` is tuned but stays on MegEngine's cpu0 device (its kernels on a dispatcher
thread, whose queue a custom op waits for), ``untuned`` keeps MegEngine's and glibc's defaults. Also a 64x64x56x56
conv forward (an output of 51 MB): the part of the boundary that grows with the output (a fresh output
page-faulted in on every call, untuned).

    .venv/bin/python benchmarks/bench_op_overhead.py [--threads 1] [--rounds 5] [--calls 200]
        [--results results/op_overhead.json]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

from bench_train_step import thread_env
from results_file import add_results_argument, save_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WORKER = r'''
import json, sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np
import megengine as mge
from basebn.utils.cpu_runtime import tune_cpu_runtime, use_inline_cpu_device
if sys.argv[2] in ("tuned", "cpu0"):
    tune_cpu_runtime()
if sys.argv[2] == "tuned":
    use_inline_cpu_device(omp_spin=True)
from basebn.ops import bn_ops, conv_ops
calls = int(sys.argv[3])
geom = conv_ops.ConvGeometry(stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1)
tiny_x, tiny_w = mge.tensor(np.ones((1, 1, 1, 1), np.float32)), mge.tensor(np.ones((1, 1, 1, 1), np.float32))
big_x = mge.tensor(np.random.default_rng(0).standard_normal((64, 64, 56, 56)).astype(np.float32))
big_w = mge.tensor(np.random.default_rng(1).standard_normal((64, 64, 1, 1)).astype(np.float32))
bn_x = mge.tensor(np.ones((2, 1, 2, 2), np.float32))
cases = {"conv 1x1x1x1": (lambda: conv_ops.conv_forward(tiny_x, tiny_w, None, geom), calls),
         "bn_stats 2x1x2x2": (lambda: bn_ops.bn_stats(bn_x), calls),
         "x + 1 (MegEngine)": (lambda: tiny_x + 1, calls),
         "bn_stats(x + 1) (a custom op fed by MegEngine's)": (lambda: bn_ops.bn_stats(bn_x + 1), calls),
         "conv 64x64x56x56 1x1": (lambda: conv_ops.conv_forward(big_x, big_w, None, geom), max(3, calls // 40))}
out = {}
for name, (fn, n) in cases.items():
    for _ in range(3):
        fn()
    mge._full_sync()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    mge._full_sync()
    out[name] = (time.perf_counter() - t0) / n * 1e6
print("@@" + json.dumps(out))
'''


def run_one(mode, threads, calls):
    env = dict(thread_env(threads), BASEBN_TUNE_CPU="0")  # import basebn tunes nothing: the worker says what runs
    out = subprocess.run([sys.executable, "-c", WORKER, ROOT, mode, str(calls)], env=env,
                         capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(f"{mode} worker failed:\n{out.stderr[-3000:]}")
    return json.loads(next(line for line in out.stdout.splitlines() if line.startswith("@@"))[2:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=200)
    add_results_argument(ap)
    args = ap.parse_args()
    modes = ("tuned", "cpu0", "untuned")
    times = {m: [] for m in modes}
    for r in range(args.rounds):
        for mode in (modes if r % 2 == 0 else modes[::-1]):
            times[mode].append(run_one(mode, args.threads, args.calls))
    print(f"| op ({args.threads} thread(s)) | tuned us/call | tuned on cpu0 | untuned | tuned / cpu0 | tuned / untuned |")
    print("|---|---|---|---|---|---|")
    rows = []
    for name in times["tuned"][0]:
        t, c, u = (statistics.median(x[name] for x in times[m]) for m in modes)
        print(f"| {name} | {t:.0f} | {c:.0f} | {u:.0f} | {t / c:.2f}x | {t / u:.2f}x |")
        rows.append({"call": name, "tuned": round(t), "tuned on cpu0": round(c), "untuned": round(u),
                     "tuned / cpu0": round(t / c, 3), "tuned / untuned": round(t / u, 3)})
    save_run(args.results, "benchmarks/bench_op_overhead.py", "calls", [args.threads], {"us_per_call": rows},
             "the fixed cost of one op call, tuned (as basebn.train starts) vs MegEngine's cpu0 device vs untuned",
             conditions=f"medians of {args.rounds} rounds, {args.calls} calls each; tuned = as basebn.train, "
                        "untuned = MegEngine's and glibc's defaults")


if __name__ == "__main__":
    main()
