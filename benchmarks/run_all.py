"""Run every benchmark one after another (`make bench`); each prints its own side-by-side table.

    .venv/bin/python benchmarks/run_all.py [--skip NAME ...]

One at a time on purpose: they measure time on a 2-core machine. Stop other jobs first (or pause
them with `kill -STOP`), or the ratios scatter. The Fashion-MNIST precise-BN/EMA experiment
(precise_bn_ema_table.py) trains models for ~30 min and is not part of this run.
"""
import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BENCHMARKS = ["bench_bn_ops.py", "bench_bn_train_ops.py", "bench_trainer_overhead.py", "bench_ema.py", "bench_conv_bn.py",
              "bench_sync_bn_mpi.py", "bench_sgd.py", "bench_event_poller.py",
              "bench_running_update.py", "bench_conv_backward.py", "bench_omp_wake.py", "bench_host_overhead.py",
              "bench_conv_layout.py"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--skip", nargs="*", default=[], help="benchmark file names (or stems) to leave out")
    args = p.parse_args()
    skip = {s if s.endswith(".py") else s + ".py" for s in args.skip}
    failed = []
    for name in BENCHMARKS:
        if name in skip:
            continue
        print(f"\n######## {name}", flush=True)
        t0 = time.time()
        rc = subprocess.call([sys.executable, os.path.join(HERE, name)], cwd=os.path.dirname(HERE))
        print(f"######## {name}: exit {rc}, {time.time() - t0:.0f} s", flush=True)
        if rc:
            failed.append(name)
    if failed:
        print("failed: " + ", ".join(failed), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
