"""One BN layer's running-statistics update per training step: basebn's kernel op vs the same update in MegEngine ops.

    .venv/bin/python benchmarks/bench_running_update.py [--channels 64 256 1280] [--rounds 5] [--calls 300]

`basebn.layers.bn_guard.apply_running_update` (what every train-mode BatchNorm2d forward calls: the non-finite
guard, the momentum update, the per-layer count) on the kernel backend (one BasebnBnRunningUpdate call) and on the
fallback backend (~20 MegEngine ops), alternating A B, B A per round in one process started as basebn.train starts
(tuned CPU runtime, inline CPU device). Each timing ends with a value read back. Prints µs per call (median of the
rounds) and the ratio; multiply by a model's BN layer count for the cost per step. ``--results FILE``
(results/running_update.json) appends them.
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import megengine as mge  # noqa: E402

from basebn.cli import quiet_device_probe  # noqa: E402
from basebn.ops import bn_ops  # noqa: E402
from basebn.layers.batch_norm import BatchNorm2d  # noqa: E402
from basebn.layers.bn_guard import apply_running_update  # noqa: E402
from basebn.utils.cpu_runtime import use_inline_cpu_device  # noqa: E402
from results_file import add_results_argument, default_threads, save_run  # noqa: E402


def per_call_us(bn, mean, var, backend, calls):
    with bn_ops.use_backend(backend):
        for _ in range(10):
            apply_running_update(bn, mean, var)
        bn.running_mean.numpy()
        t = time.perf_counter()
        for _ in range(calls):
            apply_running_update(bn, mean, var)
        bn.running_mean.numpy()
    return (time.perf_counter() - t) / calls * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--channels", nargs="+", type=int, default=[64, 256, 1280])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=300)
    add_results_argument(ap)
    args = ap.parse_args()
    quiet_device_probe()
    use_inline_cpu_device(omp_spin=True)
    rng = np.random.default_rng(0)
    print(f"{'channels':>8s} {'kernel us':>10s} {'MegEngine ops us':>17s} {'kernel / ops':>13s}")
    figures = {"us_per_layer": {}, "op_over_megengine_ops": {}}
    for c in args.channels:
        bn = BatchNorm2d(c)
        mean = mge.tensor(rng.standard_normal(c).astype(np.float32))
        var = mge.tensor(rng.random(c).astype(np.float32))
        times = {"kernel": [], "fallback": []}
        for r in range(args.rounds):
            for backend in (("kernel", "fallback") if r % 2 == 0 else ("fallback", "kernel")):
                times[backend].append(per_call_us(bn, mean, var, backend, args.calls))
        k, f = statistics.median(times["kernel"]), statistics.median(times["fallback"])
        print(f"{c:8d} {k:10.1f} {f:17.1f} {k / f:12.2f}x", flush=True)
        figures["us_per_layer"][str(c)] = [round(k), round(f)]
        figures["op_over_megengine_ops"][str(c)] = round(k / f, 3)
    save_run(args.results, "benchmarks/bench_running_update.py", "op", default_threads(), figures,
             "the BN running-statistics update (non-finite guard, momentum, count) as one op vs as MegEngine ops",
             conditions="one process, the two backends alternating; pairs [one op, MegEngine ops]")


if __name__ == "__main__":
    main()
