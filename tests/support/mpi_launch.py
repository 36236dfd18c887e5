"""Run a worker script under ``mpiexec`` from a pytest test (not a test module itself)."""
import importlib.util
import os
import shutil
import signal
import subprocess
import sys

from . import ROOT


def find_mpiexec():
    """The ``mpiexec`` next to this interpreter (the ``mpich`` wheel puts it in the venv), else PATH."""
    local = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(local, os.X_OK):
        return local
    return shutil.which("mpiexec")


def mpi_skip_reason():
    """None when multi-process tests can run, else why not."""
    if importlib.util.find_spec("mpi4py") is None:
        return "mpi4py is not installed (pip install mpi4py mpich, or -e '.[test]')"
    if find_mpiexec() is None:
        return "no mpiexec found next to the interpreter or on PATH (pip install mpich)"
    return None


def run_mpi(nprocs, script, *args, timeout=180):
    """Run ``mpiexec -n nprocs python script args...`` with the repo on PYTHONPATH.

    Returns the CompletedProcess; raises AssertionError with the output on failure or timeout
    (the whole process group is killed on timeout so no rank is left behind).
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OMP_NUM_THREADS", "1")
    # variables of an enclosing MPI job would confuse the nested launch
    for var in list(env):
        if var.startswith(("PMI_", "PMIX_", "OMPI_", "MPI_LOCAL", "HYDRA_")):
            del env[var]
    cmd = [find_mpiexec(), "-n", str(nprocs), sys.executable, script, *map(str, args)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"timed out after {timeout}s: {' '.join(cmd)}\n{out[-4000:]}")
    if proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}: {' '.join(cmd)}\n{out[-4000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, None)
