"""One rank of the /dev/shm clean-up test; run by tests/integration/test_mpi_shm_cleanup.py under mpiexec.

Usage: mpiexec -n 2 python -m tests.workers.mpi_shm_worker MODE NAMES_FILE
Rank 0 writes the /dev/shm files MPI_Init mapped (before basebn can remove them) to NAMES_FILE; then the job
ends abnormally by MODE: cli-error (a DataError through cli_main: basebn's MPI_Abort path), kill (rank 1
SIGKILLs itself), uncaught (rank 1 raises after basebn's MPI backend is up).
"""
import os
import signal
import sys


def main(mode, names_file):
    from mpi4py import MPI  # MPI_Init: MPICH maps its /dev/shm file here

    comm = MPI.COMM_WORLD
    if comm.Get_rank() == 0:
        maps = [line.split(None, 5)[5].strip() for line in open("/proc/self/maps") if len(line.split(None, 5)) == 6]
        names = sorted({p for p in maps if p.startswith("/dev/shm/") and os.path.isfile(p)})
        with open(names_file, "w") as f:
            f.write("\n".join(names))
            f.flush()
            os.fsync(f.fileno())
    comm.Barrier()

    from basebn import distributed
    from basebn.cli import cli_main
    from basebn.data import DataError

    if mode == "cli-error":
        @cli_main
        def failing(argv):
            raise DataError("a user error on every rank")
        failing([])
    distributed.init("mpi")
    if comm.Get_rank() == 1:
        if mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError("an uncaught error on rank 1")
    comm.Barrier()  # rank 0 waits here until the launcher ends the job


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
