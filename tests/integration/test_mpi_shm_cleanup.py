"""No /dev/shm file outlives an MPI job that ends abnormally: basebn's own MPI_Abort path (a user error through
cli_main), a rank killed by SIGKILL, an uncaught exception. MPICH unlinks its file only in MPI_Finalize."""
import mmap
import os
import signal
import subprocess
import sys

import pytest

from basebn.distributed.shm_files import unlink_mapped_shm_files
from tests.support import ROOT
from tests.support.mpi_launch import find_mpiexec


def test_a_mapped_shm_file_is_unlinked_and_its_mapping_stays_valid():
    path = f"/dev/shm/basebn_test_{os.getpid()}"
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    with open(path, "wb") as f:
        f.write(b"\0" * 4096)
    try:
        with open(path, "r+b") as f:
            mem = mmap.mmap(f.fileno(), 4096)
        mem[:5] = b"hello"
        assert unlink_mapped_shm_files(("basebn_test_",)) == [path]
        assert not os.path.exists(path) and mem[:5] == b"hello"  # the memory lives on, the name is gone
        mem.close()
    finally:
        if os.path.exists(path):
            os.unlink(path)


@pytest.mark.mpi
@pytest.mark.parametrize("mode", ["cli-error", "kill", "uncaught"])
def test_no_dev_shm_file_is_left_after_an_abnormal_end(tmp_path, mode):
    names_file = tmp_path / "names.txt"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "OMPI_", "MPI_LOCAL", "HYDRA_"))}
    env.update(PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    cmd = [find_mpiexec(), "-n", "2", sys.executable, "-m", "tests.workers.mpi_shm_worker", mode, str(names_file)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"the job did not end: {out[-3000:]}")
    assert proc.returncode != 0, out[-3000:]
    names = [n for n in names_file.read_text().splitlines() if n]
    if not names:
        pytest.skip("this MPI library keeps no named file in /dev/shm")
    assert [n for n in names if os.path.exists(n)] == [], out[-3000:]
    if mode == "cli-error":
        assert "error: a user error on every rank" in out and "Traceback" not in out
