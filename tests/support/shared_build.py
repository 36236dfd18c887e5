"""Build outputs made once per test run and shared by every test, and every pytest-xdist worker, that needs them.

:func:`build_once` makes an output in a folder of the run's base temporary directory (the one all xdist workers of
a run share), under an flock, so a second worker waits for the first one's build and reuses it instead of building
again; the result is pickled beside it for the workers that did not build it.
"""
import fcntl
import os
import pickle

_RESULT = "result.pickle"


def run_base_dir(tmp_path_factory):
    """The temporary directory shared by all workers of this run (a worker's own base lies inside it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def build_once(tmp_path_factory, name, make):
    """``make(folder)``'s result for the folder ``name`` of this run, made once per run (see the module docstring)."""
    base = run_base_dir(tmp_path_factory)
    folder = base / name
    with open(base / f"{name}.lock", "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            if (folder / _RESULT).exists():
                return pickle.loads((folder / _RESULT).read_bytes())
            folder.mkdir(exist_ok=True)
            result = make(str(folder))
            (folder / _RESULT).write_bytes(pickle.dumps(result))
            return result
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
