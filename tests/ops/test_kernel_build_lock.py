"""Processes that start on one kernel cache at once (pytest-xdist workers, MPI ranks) build the library once: a process
that finds the build directory's flock held waits for it, builds nothing meanwhile, then loads what the holder built.

The holder here is this test: it takes the flock of an empty build directory in a fresh cache, sees (/proc/locks) the
probe process block on it, puts a copy of this process's built library there and lets go (no compiler runs).
"""
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time

import pytest

from basebn.ops import kernel_library
from tests.support import ROOT

PROBE = """
import numpy as np, megengine as mge
from basebn.ops import bn_ops, kernel_library
from basebn.layers.conv import conv2d
y = conv2d(mge.tensor(np.ones((1, 2, 4, 4), np.float32)), mge.tensor(np.ones((3, 2, 3, 3), np.float32)), padding=1)
print("RESULT", bn_ops.backend(), kernel_library.conv_kernel_available(), float(y.numpy()[0, 0, 1, 1]),
      kernel_library.kernel_library()["path"])
"""


def _waits_on(pid, path):
    """Whether process ``pid`` is blocked on a lock of the file ``path`` (a `->` line of /proc/locks)."""
    inode = os.stat(path).st_ino
    with open("/proc/locks") as f:
        for line in f:
            fields = line.split()
            if "->" in fields:
                fields = fields[fields.index("->") + 1:]
                if fields[3] == str(pid) and fields[4].split(":")[-1] == str(inode):
                    return True
    return False


def _sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def test_a_process_waits_for_the_build_lock_and_loads_the_holders_build(tmp_path):
    lib = kernel_library.kernel_library()
    if lib is None or not lib.get("conv"):
        pytest.skip(f"the kernel library with oneDNN is not built here: {kernel_library.kernel_error()}")
    if not os.path.exists("/proc/locks"):
        pytest.skip("no /proc/locks: the wait cannot be seen")
    build_dir = tmp_path / "cache" / os.path.basename(lib["build_dir"])
    build_dir.mkdir(parents=True)
    env = dict(os.environ, BASEBN_KERNEL_CACHE=str(tmp_path / "cache"), PYTHONPATH=ROOT, BASEBN_CONV_BACKEND="auto")
    for var in ("BASEBN_KERNEL_DIR", "BASEBN_ONEDNN_ROOT", "BASEBN_BN_BACKEND"):
        env.pop(var, None)
    with open(build_dir / "build.flock", "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        proc = subprocess.Popen([sys.executable, "-c", PROBE], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        try:
            deadline = time.monotonic() + 300
            while not _waits_on(proc.pid, build_dir / "build.flock"):
                assert proc.poll() is None and time.monotonic() < deadline, "the probe never waited for the lock"
                time.sleep(0.05)
            assert sorted(os.listdir(build_dir)) == ["build.flock"]  # nothing built while it waits
            shutil.copytree(lib["build_dir"], build_dir, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("selfcheck-*", "build.flock", "lock"))
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
            out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, out + err
    result = [ln for ln in out.splitlines() if ln.startswith("RESULT")][-1].split()
    assert result[1:4] == ["kernel", "True", "18.0"]  # 2 channels x 9 taps of ones, by the oneDNN conv op
    assert result[4] == str(build_dir / os.path.basename(lib["path"]))
    assert _sha256(result[4]) == _sha256(lib["path"])  # the holder's library, not a rebuild
    assert "rebuilding" not in err, err[-2000:]
