"""A benchmark's figures as data: one run record appended to its results file (results/<name>.json).

A results file holds ``runs`` (every run, oldest first, none ever removed) and ``rows`` (which figure of which run
the pages show: scripts/make_figures.py renders them into README.md and docs/figures.md). A run record says where and
when it was measured: the host's CPU model and vector flags, its cores, the thread counts, the MegEngine (and
PyTorch, where compared) versions, the commit and the date. ``--results FILE`` is the option every timing
benchmark takes (``add_results_argument``); the benchmark builds its ``figures`` dict, in the layout its results
file's rows read, and calls ``save_run`` (or ``run_record`` + ``append_run``).
"""
import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
from importlib import metadata

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the CPU flags that decide which kernels run (the library's AVX2 build, oneDNN's avx512_core kernels)
VECTOR_FLAGS = ("sse2", "avx", "fma", "avx2", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16")


def add_results_argument(parser):
    """Adds ``--results FILE``: append this run's figures to that results file (checked before the run starts)."""
    parser.add_argument("--results", metavar="FILE", type=_results_path,
                        help="append this run's figures, host, versions and commit to this results file "
                             "(e.g. results/train_step.json), then run `make figures`")


def _results_path(path):
    """argparse type: a path whose file is absent or already a results file, so a long run does not end in an error."""
    if os.path.isdir(path):
        raise argparse.ArgumentTypeError(f"{path} is a folder: give a .json file (e.g. results/train_step.json)")
    if os.path.exists(path):
        try:
            load(path)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    elif not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise argparse.ArgumentTypeError(f"{path}: its folder does not exist")
    return path


def load(path):
    """The results file at ``path`` as a dict; ValueError (one line naming the file) if it is not one."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is not a readable results file ({e}): give another path or fix it") from None
    if not isinstance(data, dict) or not isinstance(data.get("runs"), list):
        raise ValueError(f"{path} is not a results file (no 'runs' list): give another path or fix it")
    return data


def host_info(cpuinfo="/proc/cpuinfo"):
    """{"name", "cpu_model", "flags", "cores"} of this machine; ``flags`` lists only VECTOR_FLAGS it has."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    model = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
    except OSError:
        pass
    have = [f for f in VECTOR_FLAGS if f in flags]
    widest = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else platform.machine()
    return {"name": f"{os.cpu_count()}-core {model} ({widest})", "cpu_model": model, "flags": have,
            "cores": os.cpu_count()}


def git_commit(repo=REPO):
    """HEAD's hash, with ``-dirty`` when the working tree has changes; None outside a git checkout."""
    try:
        head = subprocess.run(["git", "-C", repo, "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", repo, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("-dirty" if dirty else "")


def package_version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def version_in(python, package):
    """``package``'s version as installed for another interpreter (the PyTorch a benchmark compares with), or None."""
    code = f"import importlib.metadata as m; print(m.version({package!r}))"
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def default_threads():
    """[the thread count OpenMP and MegEngine take in this process]: $OMP_NUM_THREADS, else the usable cores; for a
    benchmark that does not set its threads itself."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    if value.isdigit() and int(value) > 0:
        return [int(value)]
    return [len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()]


def run_record(kind, command, threads, figures, conditions=None, torch_version=None, run_id=None, now=None):
    """One run: ``kind`` names what the rows select (the last run of a kind is the current figure), ``figures``
    is the benchmark's own nested dict of numbers."""
    now = now or datetime.datetime.now()
    versions = {"megengine": package_version("megengine")}
    if torch_version:
        versions["torch"] = torch_version
    record = {"id": run_id or f"{kind}-{now:%Y%m%d-%H%M%S}", "kind": kind, "date": f"{now:%Y-%m-%d %H:%M}",
              "commit": git_commit(), "host": host_info(), "threads": list(threads), "versions": versions,
              "command": command}
    if conditions:
        record["conditions"] = conditions
    record["figures"] = figures
    return record


def dumps(data, width=120):
    """``data`` as JSON text, each object or list on one line when it fits in ``width`` columns (so a results file
    reads as a table), otherwise one member per line; ends with a newline."""
    def block(value, indent):
        flat = json.dumps(value, ensure_ascii=False)
        if len(flat) + indent <= width or not isinstance(value, (dict, list)) or not value:
            return flat
        pad = " " * (indent + 1)
        if isinstance(value, dict):
            items = [f"{pad}{json.dumps(k, ensure_ascii=False)}: {block(v, indent + 1)}" for k, v in value.items()]
            return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
        return "[\n" + ",\n".join(pad + block(v, indent + 1) for v in value) + "\n" + " " * indent + "]"
    return block(data, 0) + "\n"


def append_run(path, record, benchmark, what):
    """Appends ``record`` to the results file at ``path`` (created with ``benchmark`` and ``what`` if absent),
    written through a temporary file in the same folder, so an interrupted write leaves the old file."""
    data = load(path) if os.path.exists(path) else {"benchmark": benchmark, "what": what, "runs": [], "rows": []}
    data["runs"].append(record)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".results-", suffix=".json", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(dumps(data))
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    print(f"results: run {record['id']} appended to {path}; `make figures` updates the pages")
    return data


def save_run(path, script, kind, threads, figures, what, conditions=None, torch_python=None, argv=None):
    """Appends one run of ``script`` (e.g. "benchmarks/bench_ema.py", its command line from ``argv``, else
    sys.argv) to the results file at ``path``; does nothing when ``path`` is None (no ``--results`` given).
    ``torch_python``: the Python whose torch version the record names. Returns the file's data, or None."""
    if not path:
        return None
    command = shlex.join([script] + list(sys.argv[1:] if argv is None else argv))
    torch_version = version_in(torch_python, "torch") if torch_python else None
    record = run_record(kind, command, threads, figures, conditions=conditions, torch_version=torch_version)
    return append_run(path, record, script, what)
