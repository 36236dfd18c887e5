"""The conv backward's two savings, each A/B in one process: (1) ``shortcut``: a residual block input's two
gradients summed by autodiff (an element-wise add on MegEngine's one thread) vs inside the first conv's data-gradient
op (``conv_and_identity``); (2) ``merged``: dx and dW in two op calls (dy reordered twice) vs one
(``BasebnConvBwd``, dy reordered once).

    .venv/bin/python benchmarks/bench_conv_backward.py [--variants shortcut merged] [--models resnet20 resnet18
        mbnetv2] [--threads 2 1] [--pairs 10] [--op-reps 30]

Each model runs in one process started as basebn.train starts (bench_train_step's ``basebn`` runner: tuned CPU
runtime, inline CPU device); the steps alternate pair by pair (A B, B A, ...) between the saving switched off
(``shortcut``: the conv called, x returned; ``merged``: ``conv_backward`` replaced by the two separate ops) and on,
so machine load drifts over both alike. Prints each setting's median / min step ms and their ratio. ``--op-reps``:
ResNet-20's three identity-block shapes (batch 128), alternating, median ms of one call each: data gradient then
MegEngine's add vs ``BasebnConvBwdData`` adding it; and the two ops vs ``BasebnConvBwd``. ``--results FILE``
(results/conv_backward.json) appends one run per variant (kind ``backward``: shortcut; ``backward-merged``:
merged) with the [off, on] ms and the on / off ratios.
"""
import argparse
import os
import subprocess
import sys

from results_file import add_results_argument, save_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
KINDS = {"shortcut": "backward", "merged": "backward-merged"}  # a variant's run kind in the results file

WORKER = r'''
import statistics, sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np
import megengine as mge
import benchmarks.bench_train_step as bench
import basebn.layers.conv as conv_module
from basebn.ops.conv_ops import ConvGeometry, conv_backward, conv_backward_data, conv_backward_weights
bench.quiet_device_probe()
bench.use_inline_cpu_device(omp_spin=True)
passes_input = conv_module._passes_input

def separate_ops(dy, weight, x, geom, with_bias=False, addend=None):
    dx = conv_backward_data(dy, weight, x.shape[2:], geom, addend=addend)
    return (dx,) + conv_backward_weights(x, dy, weight.shape[-2:], geom, with_bias)

def use_op(on):
    if sys.argv[4] == "shortcut":
        conv_module._passes_input = passes_input if on else (lambda conv, x: False)
    else:
        conv_module.conv_backward = conv_backward if on else separate_ops
med = lambda v: statistics.median(v) * 1e3
if sys.argv[2] == "ops":
    rng = np.random.default_rng(0)
    for c, hw in ((16, 28), (32, 14), (64, 7)):
        geom = ConvGeometry((1, 1), (1, 1), (1, 1), 1)
        dy, g, x = (mge.tensor(rng.standard_normal((128, c, hw, hw)).astype("f4")) for _ in range(3))
        w = mge.tensor(rng.standard_normal((c, c, 3, 3)).astype("f4"))
        if sys.argv[4] == "shortcut":
            off = lambda: conv_backward_data(dy, w, (hw, hw), geom) + g
            on = lambda: conv_backward_data(dy, w, (hw, hw), geom, addend=g)
        else:
            off = lambda: separate_ops(dy, w, x, geom)
            on = lambda: conv_backward(dy, w, x, geom)
        times = {"add": [], "op": []}
        for i in range(int(sys.argv[3])):
            for kind in (("add", "op") if i % 2 == 0 else ("op", "add")):
                mge._full_sync()
                t = time.perf_counter()
                out = off() if kind == "add" else on()
                mge._full_sync()
                times[kind].append(time.perf_counter() - t)
                del out
        print(f"@@ {c}x{hw}x{hw} {med(times['add']):.2f} {med(times['op']):.2f}")
    sys.exit()
runner = bench.MegEngineRunner("basebn", sys.argv[2], None)
for _ in range(2):
    runner.step()
times = {False: [], True: []}
for i in range(int(sys.argv[3])):
    for on in ((False, True) if i % 2 == 0 else (True, False)):
        use_op(on)
        times[on].append(runner.step())
print(f"@@ {med(times[False]):.0f} {min(times[False]) * 1e3:.0f} {med(times[True]):.0f} {min(times[True]) * 1e3:.0f}")
'''


def run(threads, what, count, variant):
    t = str(threads)
    env = dict(os.environ, OMP_NUM_THREADS=t, MKL_NUM_THREADS=t, OPENBLAS_NUM_THREADS=t, BASEBN_NUM_THREADS=t)
    out = subprocess.run([sys.executable, "-c", WORKER, ROOT, what, str(count), variant], env=env,
                         capture_output=True, text=True)
    lines = [l.split()[1:] for l in out.stdout.splitlines() if l.startswith("@@ ")]
    if out.returncode != 0 or not lines:
        print(f"{what} {threads} failed: {(out.stderr.strip().splitlines() or ['?'])[-1]}")
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", nargs="+", default=["shortcut", "merged"], choices=["shortcut", "merged"])
    ap.add_argument("--models", nargs="+", default=["resnet20", "resnet18", "mbnetv2"])
    ap.add_argument("--threads", nargs="+", type=int, default=[2, 1])
    ap.add_argument("--pairs", type=int, default=10, help="step pairs (saving off, on) per model")
    ap.add_argument("--op-reps", type=int, default=30, help="calls per variant and shape (0: skip)")
    add_results_argument(ap)
    args = ap.parse_args()
    for variant in args.variants:
        figures = {}
        off, on = {"shortcut": ("autodiff add", "in-op add"), "merged": ("two ops", "one op")}[variant]
        print(f"\n== {variant}")
        if args.op_reps:
            print(f"{'shape':12s} {'thr':>3s} {off + ' ms':>16s} {on + ' ms':>12s} {'ratio':>6s}")
            for threads in args.threads:
                for shape, t_off, t_on in run(threads, "ops", args.op_reps, variant):
                    print(f"{shape:12s} {threads:3d} {float(t_off):16.2f} {float(t_on):12.2f} "
                          f"{float(t_on) / float(t_off):5.2f}x", flush=True)
                    figures.setdefault("op_alone_ms", {}).setdefault(shape, {})[str(threads)] = \
                        [float(t_off), float(t_on)]
                    figures.setdefault("op_alone_ratio", {}).setdefault(shape, {})[str(threads)] = \
                        round(float(t_on) / float(t_off), 3)
        print(f"{'model':9s} {'thr':>3s} {off + ' med/min':>21s} {on + ' med/min':>18s} {'ratio':>6s}")
        for threads in args.threads:
            for model in args.models:
                for med0, min0, med1, min1 in run(threads, model, args.pairs, variant):
                    print(f"{model:9s} {threads:3d} {f'{med0}/{min0}':>21s} {f'{med1}/{min1}':>18s} "
                          f"{float(med1) / float(med0):5.2f}x", flush=True)
                    figures.setdefault("step_ms", {}).setdefault(model, {})[str(threads)] = \
                        [float(med0), float(med1)]
                    figures.setdefault("step_ratio", {}).setdefault(model, {})[str(threads)] = \
                        round(float(med1) / float(med0), 3)
        save_run(args.results, "benchmarks/bench_conv_backward.py", KINDS[variant], args.threads, figures,
                 "conv backward: the shortcut's gradient added in the data-gradient op, and both gradients from one "
                 "call", conditions=f"{variant}: pairs [{off}, {on}], alternating")


if __name__ == "__main__":
    main()
