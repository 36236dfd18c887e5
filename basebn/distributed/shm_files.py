"""The /dev/shm files of an MPI library, removed by name while the job still runs, so no ending leaves them.

MPICH maps one file per node (``/dev/shm/mpich_shm_*``, ~2 MB) in MPI_Init and unlinks it only in
MPI_Finalize: a job ended by MPI_Abort (basebn's own error path), a signal or a crash leaves it behind
until reboot. Once every local rank has mapped it, the name is no longer needed, and unlinking it then
frees the memory when the last rank exits, however it exits. Open MPI's segments are mapped by peers
lazily, so their names are removed only on the way to MPI_Abort.
"""
import os
from typing import List, Sequence

__all__ = ["MAPPED_AT_INIT", "MPI_SHM_PREFIXES", "mapped_shm_files", "unlink_mapped_shm_files"]

SHM_DIR = "/dev/shm"
MAPPED_AT_INIT = ("mpich_shm_",)  # every local rank maps these during MPI_Init
MPI_SHM_PREFIXES = MAPPED_AT_INIT + ("vader_segment.", "sm_segment.")  # + Open MPI's (attached lazily)


def mapped_shm_files(prefixes: Sequence[str], maps_path: str = "/proc/self/maps") -> List[str]:
    """Paths of the /dev/shm files whose names start with one of ``prefixes`` that this process has mapped
    and that still exist (sorted; empty where /proc is not available)."""
    try:
        with open(maps_path) as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    found = set()
    for line in lines:
        fields = line.split(None, 5)
        path = fields[5].strip() if len(fields) == 6 else ""
        if (os.path.dirname(path) == SHM_DIR and os.path.basename(path).startswith(tuple(prefixes))
                and os.path.isfile(path)):  # an unlinked one reads "PATH (deleted)": not a file
            found.add(path)
    return sorted(found)


def unlink_mapped_shm_files(prefixes: Sequence[str] = MPI_SHM_PREFIXES) -> List[str]:
    """Unlink this user's mapped /dev/shm files with these prefixes (the mappings stay valid); the removed paths.
    Never raises: another rank may have removed a name first."""
    removed = []
    for path in mapped_shm_files(prefixes):
        try:
            if os.stat(path).st_uid == os.geteuid():
                os.unlink(path)
                removed.append(path)
        except OSError:
            pass
    return removed
