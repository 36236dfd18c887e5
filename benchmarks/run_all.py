"""Run every timing script, benchmarks/bench_*.py, one after another (`make bench`); each prints its own table.

    .venv/bin/python benchmarks/run_all.py [--torch-python PY] [--skip NAME ...] [--only NAME ...]

The scripts are found by name (bench_*.py), so a new one runs without being listed here. Three compare against
PyTorch and cannot run without it (NEEDS_TORCH: bench_bn_vs_torch, bench_linear, bench_max_pool): they run when
``--torch-python`` names a Python with torch (`make bench TORCH_PYTHON=PY`), and are reported as skipped
otherwise; the scripts with an optional PyTorch runner get the same Python. bench_sync_bn_mpi launches itself
under the venv's mpiexec (`make setup` installs it). One at a time on purpose: they measure time on a 2-core
machine. Stop other jobs first (or pause them with `kill -STOP`), or the ratios scatter. The experiments
(experiments/: tables of top-1 over trained models) take tens of minutes to hours and are not timing scripts.
"""
import argparse
import glob
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
NEEDS_TORCH = ("bench_bn_vs_torch.py", "bench_linear.py", "bench_max_pool.py")  # --torch-python is required
TORCH_OPTIONAL = ("bench_activation_memory.py", "bench_conv_backends.py", "bench_sgd.py", "bench_train_step.py")


def timing_scripts():
    """Every benchmarks/bench_*.py, by name."""
    return sorted(os.path.basename(p) for p in glob.glob(os.path.join(HERE, "bench_*.py")))


def command(name, torch_python):
    """The command line that runs ``name``, or None when it cannot run here (it needs PyTorch)."""
    cmd = [sys.executable, os.path.join(HERE, name)]
    if name in NEEDS_TORCH + TORCH_OPTIONAL and torch_python:
        return cmd + ["--torch-python", torch_python]
    return None if name in NEEDS_TORCH else cmd


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--torch-python", help="a Python with torch, for the scripts that compare against PyTorch")
    p.add_argument("--skip", nargs="*", default=[], help="benchmark file names (or stems) to leave out")
    p.add_argument("--only", nargs="*", default=[], help="run only these (file names or stems)")
    args = p.parse_args()
    names = lambda given: {s if s.endswith(".py") else s + ".py" for s in given}  # noqa: E731
    skip, only = names(args.skip), names(args.only)
    failed, skipped = [], []
    for name in timing_scripts():
        if name in skip or (only and name not in only):
            continue
        cmd = command(name, args.torch_python)
        if cmd is None:
            skipped.append(name)
            continue
        print(f"\n######## {name}", flush=True)
        t0 = time.time()
        rc = subprocess.call(cmd, cwd=os.path.dirname(HERE))
        print(f"######## {name}: exit {rc}, {time.time() - t0:.0f} s", flush=True)
        if rc:
            failed.append(name)
    if skipped:
        print("skipped (no --torch-python): " + ", ".join(skipped), file=sys.stderr)
    if failed:
        print("failed: " + ", ".join(failed), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
