"""CPU benchmark: training-mode BatchNorm forward + backward, side by side in one run.

  basebn-kernel    bn_stats + bn_normalize, then bn_backward_reduce + bn_backward_elemt (C++)
  basebn-fallback  the same four ops through the pure-MegEngine fallback
  mge-BatchNorm2d  megengine.module.BatchNorm2d forward + backward through GradManager

Then the fused BN-activation layers against the same work unfused, forward + backward through GradManager,
for each activation of --acts (default relu):
  bn-ACT           basebn BatchNorm2d then F.ACT             vs  BatchNormAct2d(act=ACT) (one fused kernel each way)
  bn-add-relu      basebn BatchNorm2d, + shortcut, F.relu    vs  BatchNormAct2d(x, shortcut) (ReLU / ReLU6 only:
                   SiLU / HSwish have no fused residual form)

and, per shape, the fused ops alone (interleaved medians): act_normalize, act_bwd_reduce, act_bwd_elemt per
activation beside the plain normalize / bwd_reduce / bwd_elemt.

Printed: median ms and speed-up over BatchNorm2d (over the unfused layers for the fused ones). The methods take
turns in every round (interleaved), so a loaded machine slows them alike. ``--results FILE``
(results/bn_ops_fused.json) appends the speed-ups; a fused layer's ``speedup_by_median`` gives ``v`` (all rounds)
with ``min`` and ``max``, the speed-ups of the first and the second half of the rounds (two measurements in one run).

    .venv/bin/python benchmarks/bench_bn_ops.py [--reps 7] [--shapes 128,32,28,28 32,256,14,14]
    .venv/bin/python benchmarks/bench_bn_ops.py --fused-only --acts silu hswish --shapes 32,64,56,56 128,32,28,28
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import megengine as mge  # noqa: E402
import megengine.functional as F  # noqa: E402
import megengine.module as M  # noqa: E402
from megengine.autodiff import GradManager  # noqa: E402

from basebn.layers import BatchNorm2d, BatchNormAct2d  # noqa: E402
from basebn.ops import bn_ops, kernel_library  # noqa: E402
from results_file import add_results_argument, save_run  # noqa: E402

EPS = 1e-5


def _time_once(fn):
    mge._full_sync()
    t0 = time.perf_counter()
    fn()
    mge._full_sync()
    return (time.perf_counter() - t0) * 1e3


def _median_ms(fn, reps, warmup):
    for _ in range(warmup):
        fn()
    return float(np.median([_time_once(fn) for _ in range(reps)]))


def _interleaved_times(fns, reps, warmup):
    """{method: [ms per round]}, the methods taking turns in every round (fair under shared CPUs)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times = {k: [] for k in fns}
    for _ in range(reps):
        for k, fn in fns.items():
            times[k].append(_time_once(fn))
    return times


def _interleaved_medians(fns, reps, warmup):
    """Median ms and min ms per method, the methods taking turns in every round."""
    times = _interleaved_times(fns, reps, warmup)
    return {k: float(np.median(v)) for k, v in times.items()}, {k: float(np.min(v)) for k, v in times.items()}


def basebn_fwd_bwd(x, dy, weight, bias):
    cnt = x.size // x.shape[1]
    mean, m2 = bn_ops.bn_stats(x)
    invstd = 1.0 / F.sqrt(m2 / cnt + EPS)
    y = bn_ops.bn_normalize(x, mean, invstd, weight, bias)
    sum_dy, sum_dy_xhat = bn_ops.bn_backward_reduce(dy, x, mean, invstd)
    dx = bn_ops.bn_backward_elemt(dy, x, mean, invstd, weight, sum_dy, sum_dy_xhat, cnt)
    # dweight = sum_dy_xhat, dbias = sum_dy (already computed)
    return y, dx, sum_dy_xhat, sum_dy


def make_mge_bn(c, x, dy):
    bn = M.BatchNorm2d(c)
    bn.train()
    gm = GradManager().attach(list(bn.parameters()) + [x])

    def run():
        with gm:
            y = bn(x)
            gm.backward(y, dy)
        return y, x.grad

    return run


def make_layer_run(fused, residual, x, s, dy, act="relu"):
    """Forward + backward of BN -> [add s] -> act: one BatchNormAct2d (``fused``) or BatchNorm2d, add, F.<act>."""
    c = x.shape[1]
    bn = BatchNormAct2d(c, act=act) if fused else BatchNorm2d(c)
    fn = getattr(F, act)
    inputs = [x, s] if residual else [x]
    gm = GradManager().attach(list(bn.parameters()) + inputs)

    def run():
        with gm:
            if fused:
                y = bn(*inputs)
            else:
                y = fn(bn(x) + s) if residual else fn(bn(x))
            gm.backward(y, dy)
        return y, x.grad

    return run


def fused_rows(shape, rng, reps, warmup, acts=("relu",)):
    """{name: (median ms, min ms, [median ms of the first half of the rounds, of the second half])} of the unfused
    and fused BN-act layers per activation of ``acts``, and BN-add-act for those with a residual form (kernel
    backend)."""
    x = mge.tensor(rng.standard_normal(shape).astype(np.float32))
    s = mge.tensor(rng.standard_normal(shape).astype(np.float32))
    dy = mge.tensor(rng.standard_normal(shape).astype(np.float32))
    kinds = [(f"bn-{act}", act, False) for act in acts]
    kinds += [(f"bn-add-{act}", act, True) for act in acts if act not in bn_ops.PRE_GRAD_ACTIVATIONS]
    fns = {f"{kind}-{'fused' if fused else 'unfused'}": make_layer_run(fused, residual, x, s, dy, act)
           for kind, act, residual in kinds for fused in (False, True)}
    with bn_ops.use_backend("kernel"):
        times = _interleaved_times(fns, reps, warmup)
    half = max(1, reps // 2)
    return {k: (float(np.median(v)), float(np.min(v)),
                [float(np.median(v[:half])), float(np.median(v[half:] or v[:half]))]) for k, v in times.items()}


def fused_figures(res):
    """One shape's fused rows (``fused_rows``) as results/bn_ops_fused.json reads them: {"speedup_by_median":
    {ACT or add-ACT: {"v", "min", "max"}}, "speedup_by_min": {...: ratio}}; a speed-up is unfused / fused."""
    by_median, by_min = {}, {}
    for name, (ms, low, halves) in res.items():
        if not name.endswith("-fused"):
            continue
        key = name[len("bn-"):-len("-fused")]
        ref_ms, ref_low, ref_halves = res[name.replace("-fused", "-unfused")]
        split = [r / f for r, f in zip(ref_halves, halves)]
        by_median[key] = {"v": round(ref_ms / ms, 3), "min": round(min(split), 3), "max": round(max(split), 3)}
        by_min[key] = round(ref_low / low, 3)
    return {"speedup_by_median": by_median, "speedup_by_min": by_min}


def fused_op_split(shape, rng, reps, warmup, acts=("relu",)):
    """{op: median ms} of the plain BN element-wise ops and the fused ones per activation (kernel backend)."""
    c, cnt = shape[1], int(np.prod(shape)) // shape[1]
    x = mge.tensor(rng.standard_normal(shape).astype(np.float32))
    dy = mge.tensor(rng.standard_normal(shape).astype(np.float32))
    w = mge.tensor(rng.uniform(0.5, 1.5, c).astype(np.float32))
    b = mge.tensor(rng.standard_normal(c).astype(np.float32))
    with bn_ops.use_backend("kernel"):
        mean, m2 = bn_ops.bn_stats(x)
        invstd = 1.0 / F.sqrt(m2 / cnt + EPS)
        s1, s2 = bn_ops.bn_backward_reduce(dy, x, mean, invstd)
        fns = {"normalize": lambda: bn_ops.bn_normalize(x, mean, invstd, w, b),
               "bwd_reduce": lambda: bn_ops.bn_backward_reduce(dy, x, mean, invstd),
               "bwd_elemt": lambda: bn_ops.bn_backward_elemt(dy, x, mean, invstd, w, s1, s2, cnt)}
        for act in acts:
            y = bn_ops.bn_act_normalize(x, mean, invstd, w, b, act=act)
            yb = y if act in bn_ops.OUTPUT_GRAD_ACTIVATIONS else None
            fns[f"{act}:act_normalize"] = lambda act=act: bn_ops.bn_act_normalize(x, mean, invstd, w, b, act=act)
            fns[f"{act}:act_bwd_reduce"] = lambda act=act, yb=yb: bn_ops.bn_act_backward_reduce(
                dy, yb, x, mean, invstd, act=act, weight=w, bias=b)
            fns[f"{act}:act_bwd_elemt"] = lambda act=act, yb=yb: bn_ops.bn_act_backward_elemt(
                dy, yb, x, mean, invstd, w, s1, s2, cnt, act=act, bias=b)
        med, _ = _interleaved_medians(fns, reps, warmup)
    return med


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--shapes", nargs="*", default=["128,32,28,28", "32,256,14,14"])
    ap.add_argument("--acts", nargs="*", default=["relu"], choices=[a for a in bn_ops.ACTIVATIONS if a != "identity"],
                    help="activations of the fused-vs-unfused rows")
    ap.add_argument("--fused-only", action="store_true", help="only the fused-vs-unfused rows")
    add_results_argument(ap)
    args = ap.parse_args()
    figures = {"speedup_by_median": {}, "speedup_by_min": {}, "bn_layer_over_mge_batchnorm2d": {}}

    have_kernel = kernel_library.kernel_available()
    threads = os.environ.get("BASEBN_NUM_THREADS") or str(len(os.sched_getaffinity(0)))
    print(f"megengine {mge.__version__}, cores {len(os.sched_getaffinity(0))}, kernel threads {threads}, "
          f"kernels: {'available' if have_kernel else 'UNAVAILABLE: ' + str(kernel_library.kernel_error())}")

    rows = []
    rng = np.random.default_rng(0)
    for spec in [] if args.fused_only else args.shapes:
        shape = tuple(int(v) for v in spec.split(","))
        c = shape[1]
        x = mge.tensor(rng.standard_normal(shape).astype(np.float32))
        dy = mge.tensor(rng.standard_normal(shape).astype(np.float32))
        w = mge.tensor(np.ones(c, np.float32))
        b = mge.tensor(np.zeros(c, np.float32))

        fns = {"mge-BatchNorm2d": make_mge_bn(c, x, dy)}
        split = None

        def fallback_run():
            with bn_ops.use_backend("fallback"):
                return basebn_fwd_bwd(x, dy, w, b)

        fns["basebn-fallback"] = fallback_run
        if have_kernel:

            def kernel_run():
                with bn_ops.use_backend("kernel"):
                    return basebn_fwd_bwd(x, dy, w, b)

            fns["basebn-kernel"] = kernel_run
        res, best = _interleaved_medians(fns, args.reps, args.warmup)
        if have_kernel:
            with bn_ops.use_backend("kernel"):  # per-op split of the kernel path
                mean, m2 = bn_ops.bn_stats(x)
                invstd = 1.0 / F.sqrt(m2 / (x.size // c) + EPS)
                s1, s2 = bn_ops.bn_backward_reduce(dy, x, mean, invstd)
                cnt = x.size // c
                split = {
                    "stats": _median_ms(lambda: bn_ops.bn_stats(x), args.reps, 1),
                    "normalize": _median_ms(lambda: bn_ops.bn_normalize(x, mean, invstd, w, b), args.reps, 1),
                    "bwd_reduce": _median_ms(lambda: bn_ops.bn_backward_reduce(dy, x, mean, invstd), args.reps, 1),
                    "bwd_elemt": _median_ms(
                        lambda: bn_ops.bn_backward_elemt(dy, x, mean, invstd, w, s1, s2, cnt), args.reps, 1
                    ),
                }
        rows.append((shape, res, best, split))

    if rows:
        print()
        print(f"{'shape':>16} {'method':>16} {'median ms':>10} {'min ms':>8} {'vs BN2d':>8}")
    for shape, res, best, split in rows:
        ref = res["mge-BatchNorm2d"]
        for name in ("basebn-kernel", "mge-BatchNorm2d", "basebn-fallback"):
            if name in res:
                ms = res[name]
                print(f"{'x'.join(map(str, shape)):>16} {name:>16} {ms:10.2f} {best[name]:8.2f} "
                      f"{ref / ms:7.2f}x")
                figures["bn_layer_over_mge_batchnorm2d"].setdefault("x".join(map(str, shape)), {})[name] = \
                    round(ref / ms, 3)
        if split:
            print(f"{'':>16} kernel per-op median ms: " + ", ".join(f"{k} {v:.2f}" for k, v in split.items()))
    if have_kernel:
        print(f"\n{'shape':>16} {'layers':>20} {'median ms':>10} {'min ms':>8} {'vs unfused':>10}")
        for spec in args.shapes:
            shape = tuple(int(v) for v in spec.split(","))
            res = fused_rows(shape, rng, args.reps, args.warmup, args.acts)
            for name, (ms, low, _) in res.items():
                ref = res[name.replace("-fused", "-unfused")][0]
                print(f"{'x'.join(map(str, shape)):>16} {name:>20} {ms:10.2f} {low:8.2f} {ref / ms:9.2f}x")
            for key, by_key in fused_figures(res).items():
                figures[key][spec.replace(",", "x")] = by_key
            split = fused_op_split(shape, rng, args.reps, args.warmup, args.acts)
            print(f"{'':>16} per-op median ms: " + ", ".join(f"{k} {v:.2f}" for k, v in split.items()))
    save_run(args.results, "benchmarks/bench_bn_ops.py", "fused", [int(threads)], figures,
             "a fused BN → SiLU / HSwish / ReLU layer's forward + backward vs BatchNorm2d then the activation",
             conditions=f"medians of {args.reps} interleaved rounds; kernels "
                        f"{'available' if have_kernel else 'unavailable'}")


if __name__ == "__main__":
    main()
