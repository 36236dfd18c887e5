"""CPU benchmark: a training-mode BN layer's forward + backward, basebn vs PyTorch, side by side in one run.

Cases, each a layer called on x (and a shortcut s) with the input and parameter gradients taken:
  bn           basebn BatchNorm2d                      vs  torch.nn.BatchNorm2d
  bn-relu      basebn BatchNormAct2d(act="relu")       vs  torch BatchNorm2d then F.relu (in place, as torchvision)
  bn-add-relu  basebn BatchNormAct2d(x, shortcut)      vs  torch F.relu(bn(x) + s) (the end of a ResNet block)
Each framework runs in its own process with the same thread count (bench_train_step.thread_env); rounds
alternate (basebn, torch), (torch, basebn), ...; each process times ``--reps`` calls after warm-up and prints its
median; the table gives the median over rounds and the ratio basebn / PyTorch. ``--split`` also prints basebn's
four BN ops alone (stats, normalize, backward reduce, backward elemt) and a plain read+write of the tensor
(``F.copy``-free: numpy ``np.add(x, 0, out=y)``), the memory-bandwidth floor of one element-wise pass.

    .venv/bin/python benchmarks/bench_bn_vs_torch.py --torch-python .venv-bench/bin/python [--threads 1 2]
        [--shapes 128,32,28,28 32,256,14,14] [--cases bn bn-relu bn-add-relu] [--rounds 3] [--reps 9] [--split]
        [--results results/bn_vs_torch.json]
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys

from bench_train_step import thread_env
from results_file import add_results_argument, append_run, run_record, version_in

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WORKER = r'''
import json, sys, time
import numpy as np
shape, reps, framework, threads, case = (tuple(int(v) for v in sys.argv[1].split(",")), int(sys.argv[2]),
                                         sys.argv[3], int(sys.argv[4]), sys.argv[5])
rng = np.random.default_rng(0)
x0, s0, dy0 = (rng.standard_normal(shape).astype(np.float32) for _ in range(3))
c = shape[1]
if framework == "torch":
    import torch
    import torch.nn.functional as TF
    torch.set_num_threads(threads)
    bn = torch.nn.BatchNorm2d(c)
    x, s, dy = torch.tensor(x0, requires_grad=True), torch.tensor(s0, requires_grad=True), torch.tensor(dy0)
    def layer():
        if case == "bn":
            return bn(x)
        if case == "bn-relu":
            return TF.relu(bn(x), inplace=True)
        return TF.relu(bn(x) + s, inplace=True)
    def step():
        layer().backward(dy)
        x.grad = s.grad = None
        bn.weight.grad = bn.bias.grad = None
    sync = lambda: None
else:
    sys.path.insert(0, sys.argv[6])
    import megengine as mge
    from megengine.autodiff import GradManager
    from basebn.cli import quiet_device_probe
    from basebn.layers import BatchNorm2d, BatchNormAct2d
    quiet_device_probe()  # as the CLIs start: tune_cpu_runtime before the first operation
    bn = BatchNorm2d(c) if case == "bn" else BatchNormAct2d(c, act="relu")
    x, s, dy = mge.tensor(x0), mge.tensor(s0), mge.tensor(dy0)
    gm = GradManager().attach(list(bn.parameters()) + [x, s])
    def step():
        with gm:
            y = bn(x, s) if case == "bn-add-relu" else bn(x)
            gm.backward(y, dy)
        x.grad = s.grad = None
        for p in bn.parameters():
            p.grad = None
    sync = mge._full_sync
def median_ms(fn):
    for _ in range(3):
        fn()
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]
out = {"layer": median_ms(step)}
if framework == "basebn" and len(sys.argv) > 7:  # --split: the four ops alone and a bandwidth floor
    import megengine.functional as F
    from basebn.ops import bn_ops
    cnt = x0.size // c
    w, b = mge.tensor(np.ones(c, np.float32)), mge.tensor(np.zeros(c, np.float32))
    mean, m2 = bn_ops.bn_stats(x)
    invstd = 1.0 / F.sqrt(m2 / cnt + 1e-5)
    s1, s2 = bn_ops.bn_backward_reduce(dy, x, mean, invstd)
    out["stats"] = median_ms(lambda: bn_ops.bn_stats(x))
    out["normalize"] = median_ms(lambda: bn_ops.bn_normalize(x, mean, invstd, w, b))
    out["bwd_reduce"] = median_ms(lambda: bn_ops.bn_backward_reduce(dy, x, mean, invstd))
    out["bwd_elemt"] = median_ms(lambda: bn_ops.bn_backward_elemt(dy, x, mean, invstd, w, s1, s2, cnt))
    ybuf = np.empty_like(x0)
    out["numpy read+write"] = median_ms(lambda: np.add(x0, 0.0, out=ybuf))
print("@@" + json.dumps(out))
'''


def run_one(python, framework, shape, threads, reps, case, split):
    """{name: median ms} of one process."""
    argv = [python, "-c", WORKER, shape, str(reps), framework, str(threads), case, ROOT] + (["split"] if split else [])
    out = subprocess.run(argv, env=thread_env(threads), capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(f"{framework} worker failed:\n{out.stderr[-3000:]}")
    return json.loads(next(line for line in out.stdout.splitlines() if line.startswith("@@"))[2:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--torch-python", required=True, help="a python with torch")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--shapes", nargs="+", default=["128,32,28,28", "32,256,14,14"])
    ap.add_argument("--cases", nargs="+", default=["bn", "bn-relu", "bn-add-relu"],
                    choices=["bn", "bn-relu", "bn-add-relu"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--split", action="store_true", help="also basebn's four BN ops alone (case bn)")
    add_results_argument(ap)
    args = ap.parse_args()
    figures = {"ms": {}}
    pythons = {"basebn": sys.executable, "torch": args.torch_python}
    print("| case | shape (N,C,H,W) | threads | basebn ms | PyTorch ms | basebn / PyTorch |")
    print("|---|---|---|---|---|---|")
    splits = []
    for shape in args.shapes:
        for threads in args.threads:
            for case in args.cases:
                times, extra = {"basebn": [], "torch": []}, []
                for r in range(args.rounds):
                    for fw in (("basebn", "torch") if r % 2 == 0 else ("torch", "basebn")):
                        res = run_one(pythons[fw], fw, shape, threads, args.reps, case, args.split and case == "bn")
                        times[fw].append(res.pop("layer"))
                        if res:
                            extra.append(res)
                m, t = statistics.median(times["basebn"]), statistics.median(times["torch"])
                print(f"| {case} | {shape} | {threads} | {m:.2f} | {t:.2f} | {m / t:.2f}x |", flush=True)
                key, size = case.replace("-", "_"), shape.replace(",", "x")
                figures.setdefault(key, {}).setdefault(size, {})[str(threads)] = round(m / t, 3)
                figures["ms"].setdefault(key, {}).setdefault(size, {})[str(threads)] = [round(m, 2), round(t, 2)]
                if extra:
                    splits.append((shape, threads, {k: statistics.median(e[k] for e in extra) for k in extra[0]}))
    for shape, threads, split in splits:
        print(f"basebn ops alone, {shape}, {threads} thread(s), ms: "
              + ", ".join(f"{k} {v:.2f}" for k, v in split.items()))
        figures.setdefault("ops_alone_ms", {}).setdefault(shape.replace(",", "x"), {})[str(threads)] = \
            {k: round(v, 2) for k, v in split.items()}
    if args.results:
        record = run_record("layer", shlex.join(["benchmarks/bench_bn_vs_torch.py"] + sys.argv[1:]), args.threads,
                            figures, torch_version=version_in(args.torch_python, "torch"))
        append_run(args.results, record, "benchmarks/bench_bn_vs_torch.py",
                   "a BN layer's forward + backward in training mode vs PyTorch's")


if __name__ == "__main__":
    main()
