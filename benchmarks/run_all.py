"""Run every timing script, benchmarks/bench_*.py, one after another (`make bench`); each prints its own table and
appends its run to its results file, then `make figures` regenerates the pages from them.

    .venv/bin/python benchmarks/run_all.py [--torch-python PY] [--skip NAME ...] [--only NAME ...] [--no-results]

Each script gets ``--results results/NAME.json``, its file under results/ (RESULTS_FILES names those not called
after the script); a script whose file is not there yet (bench_deploy) runs without it, since a new results file
needs its rows and section written before `make figures` can show it. RUN_ARGS adds the options whose run is the
kind its file's rows read (bench_train_step's ``--same-window``; bench_bn_ops's activations). ``--no-results``
leaves the files as they are.

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
RESULTS = os.path.join(os.path.dirname(HERE), "results")
NEEDS_TORCH = ("bench_bn_vs_torch.py", "bench_linear.py", "bench_max_pool.py")  # --torch-python is required
TORCH_OPTIONAL = ("bench_activation_memory.py", "bench_conv_backends.py", "bench_sgd.py", "bench_train_step.py")
# results files not named after their script (bench_NAME.py -> results/NAME.json otherwise)
RESULTS_FILES = {"bench_bn_ops.py": "bn_ops_fused.json", "bench_omp_wake.py": "omp_spin.json"}
# options that make a run the kind its results file's rows read
RUN_ARGS = {"bench_train_step.py": ["--same-window"], "bench_bn_ops.py": ["--acts", "silu", "hswish", "relu"]}


def timing_scripts():
    """Every benchmarks/bench_*.py, by name."""
    return sorted(os.path.basename(p) for p in glob.glob(os.path.join(HERE, "bench_*.py")))


def results_file(name, folder=RESULTS):
    """results/<file> of the script ``name`` (a path relative to the repository), or None when it has none yet."""
    file = RESULTS_FILES.get(name, name[len("bench_"):-len(".py")] + ".json")
    return os.path.join("results", file) if os.path.isfile(os.path.join(folder, file)) else None


def command(name, torch_python, results=True):
    """The command line that runs ``name`` (with ``--results`` its results file, when it has one), or None when it
    cannot run here (it needs PyTorch)."""
    if name in NEEDS_TORCH and not torch_python:
        return None
    cmd = [sys.executable, os.path.join(HERE, name)] + RUN_ARGS.get(name, [])
    if name in NEEDS_TORCH + TORCH_OPTIONAL and torch_python:
        cmd += ["--torch-python", torch_python]
    path = results_file(name) if results else None
    return cmd + ["--results", path] if path else cmd


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--torch-python", help="a Python with torch, for the scripts that compare against PyTorch")
    p.add_argument("--skip", nargs="*", default=[], help="benchmark file names (or stems) to leave out")
    p.add_argument("--only", nargs="*", default=[], help="run only these (file names or stems)")
    p.add_argument("--no-results", action="store_true", help="append nothing to the results files")
    args = p.parse_args()
    names = lambda given: {s if s.endswith(".py") else s + ".py" for s in given}  # noqa: E731
    skip, only = names(args.skip), names(args.only)
    failed, skipped = [], []
    for name in timing_scripts():
        if name in skip or (only and name not in only):
            continue
        cmd = command(name, args.torch_python, results=not args.no_results)
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
    if not args.no_results:
        print("the runs are in results/*.json: `make figures` regenerates README.md's and docs/figures.md's tables")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
