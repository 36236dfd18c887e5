"""CPU benchmark: the one-call local training ops against the unfused ops they replace, side by side in one process.

  one-call fwd   bn_ops.bn_act_train_forward (statistics, invstd and y in one op)
  unfused fwd    bn_stats, invstd in MegEngine ops, bn_act_normalize
  one-call bwd   bn_ops.bn_act_train_backward (the two sums and dx in one op)
  unfused bwd    bn_act_backward_reduce, bn_act_backward_elemt

Each thread count runs in its own process ($BASEBN_NUM_THREADS / OMP_NUM_THREADS set before MegEngine loads); within
it the four take turns in every round (interleaved), so a loaded machine slows them alike. Printed: medians (ms)
and one-call / unfused. The one-call op picks its plan by size (docs/bn_design.md); --plan forces one.

    .venv/bin/python benchmarks/bench_bn_train_ops.py [--shapes 32,64,56,56 128,32,28,28 32,256,14,14]
        [--threads 1 2] [--act relu] [--rounds 30] [--plan auto|channels|rows] [--results results/bn_train_ops.json]
"""
import argparse
import json
import os
import subprocess
import sys

from results_file import add_results_argument, save_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WORKER = r'''
import json, sys, time
import numpy as np
sys.path.insert(0, sys.argv[4])
import megengine as mge
from basebn.cli import quiet_device_probe
quiet_device_probe()
from basebn.ops import bn_ops
shape, act, rounds = tuple(int(v) for v in sys.argv[1].split(",")), sys.argv[2], int(sys.argv[3])
rng = np.random.default_rng(0)
x = mge.tensor(rng.standard_normal(shape).astype(np.float32))
dy = mge.tensor(rng.standard_normal(shape).astype(np.float32))
c = shape[1]
w, b = mge.tensor(np.ones(c, np.float32)), mge.tensor(np.zeros(c, np.float32))
cnt = bn_ops.channel_count(x)
with bn_ops.use_backend("kernel"):
    y, mean, m2, inv = bn_ops.bn_act_train_forward(x, w, b, 1e-5, act)
    yb = y if act in bn_ops.OUTPUT_GRAD_ACTIVATIONS else None

    def unfused_fwd():
        mn, q = bn_ops.bn_stats(x)
        return bn_ops.bn_act_normalize(x, mn, (q * (1.0 / cnt) + 1e-5) ** -0.5, w, b, act)

    def unfused_bwd():
        s1, s2 = bn_ops.bn_act_backward_reduce(dy, yb, x, mean, inv, act, w, b)
        return bn_ops.bn_act_backward_elemt(dy, yb, x, mean, inv, w, s1, s2, cnt, act, False, b)

    fns = {"one-call fwd": lambda: bn_ops.bn_act_train_forward(x, w, b, 1e-5, act), "unfused fwd": unfused_fwd,
           "one-call bwd": lambda: bn_ops.bn_act_train_backward(dy, yb, x, mean, inv, w, b, act),
           "unfused bwd": unfused_bwd}

    def timed(fn, reps=5):
        mge._full_sync()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        mge._full_sync()
        return (time.perf_counter() - t0) / reps * 1e3

    for fn in fns.values():
        fn()
    res = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            res[k].append(timed(fn))
print("@@" + json.dumps({k: float(np.median(v)) for k, v in res.items()}))
'''


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["32,64,56,56", "128,32,28,28", "32,256,14,14"])
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--act", default="relu")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--plan", choices=["auto", "channels", "rows"], default="auto")
    add_results_argument(ap)
    args = ap.parse_args()
    ratios = {}
    print("| shape (N,C,H,W) | threads | one-call fwd | unfused fwd | ratio | one-call bwd | unfused bwd | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for threads in args.threads:
        for shape in args.shapes:
            env = dict(os.environ, BASEBN_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
            if args.plan != "auto":
                env["BASEBN_BN_TRAIN_PLAN"] = args.plan
            out = subprocess.run([sys.executable, "-c", WORKER, shape, args.act, str(args.rounds), ROOT], env=env,
                                 capture_output=True, text=True, check=True).stdout
            r = json.loads(next(line for line in out.splitlines() if line.startswith("@@"))[2:])
            print(f"| {shape} | {threads} | {r['one-call fwd']:.2f} | {r['unfused fwd']:.2f} | "
                  f"{r['one-call fwd'] / r['unfused fwd']:.2f}x | {r['one-call bwd']:.2f} | {r['unfused bwd']:.2f} | "
                  f"{r['one-call bwd'] / r['unfused bwd']:.2f}x |", flush=True)
            ratios.setdefault(shape.replace(",", "x"), {})[str(threads)] = {
                "forward": round(r["one-call fwd"] / r["unfused fwd"], 3),
                "backward": round(r["one-call bwd"] / r["unfused bwd"], 3)}
    save_run(args.results, "benchmarks/bench_bn_train_ops.py", "ops", args.threads, results_figures(ratios),
             "the one-call local BN training ops vs the unfused ops they replace (BN-ReLU)",
             conditions=f"activation {args.act}, plan {args.plan}; each thread count in its own process, the four "
                        "interleaved in every round, medians")


def results_figures(ratios):
    """results/bn_train_ops.json's layout from ``ratios`` ({shape: {threads: {"forward", "backward"}}}, shapes in
    the order given): one_call_over_unfused per shape, and the shapes after the first together ("A and B": the
    min-max of their ratios, forward and backward, every thread count)."""
    figures = {"one_call_over_unfused": dict(ratios)}
    rest = list(ratios)[1:]
    if rest:
        values = [v for shape in rest for by_op in ratios[shape].values() for v in by_op.values()]
        figures["one_call_over_unfused"][" and ".join(rest)] = {"min": min(values), "max": max(values)}
    return figures


if __name__ == "__main__":
    main()
