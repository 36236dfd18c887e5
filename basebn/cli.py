"""What every CLI shares: one clear line for what a user can fix, and no rank left waiting.

User errors print `error: ...` and exit 2; a full or read-only disk prints one line and exits 1; Ctrl-C
prints one line and exits 130. In a multi-process job a failing rank ends the whole job (MPI_Abort),
after a short pause on ranks other than 0 so that rank 0's own error, when it has one, is the one printed.
"""
import errno
import functools
import os
import sys
import time
import traceback

import megengine as mge

from . import distributed
from .checkpoint import CheckpointError
from .config import ConfigError
from .data import DataError
from .engine.run_dir import RunDirError
from .zoo import ZooError

__all__ = ["USER_ERRORS", "cli_main", "quiet_device_probe"]

USER_ERRORS = (ConfigError, DataError, CheckpointError, ZooError, RunDirError)
# what the machine, not the code, got wrong: reported in one line
_DISK_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, errno.EDQUOT}
_LATE_RANK_PAUSE_S = 0.5


def quiet_device_probe():
    """Probe for CUDA once with stderr silenced: on a CPU machine MegEngine prints a five-line banner and
    `debug: failed to load cuda func` lines at its first device query; after the probe nothing is silenced."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        mge.is_cuda_available()
        mge.tensor(0).numpy()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _one_line(exc):
    if isinstance(exc, KeyboardInterrupt):
        return 130, "interrupted; a training run continues from its last checkpoint with --resume"
    if isinstance(exc, OSError) and exc.errno in _DISK_ERRNOS:
        where = f" ({exc.filename})" if exc.filename else ""
        return 1, (f"error: {exc.strerror}{where}; files written before stay intact (checkpoints are replaced "
                   f"atomically): free space or fix permissions, then run again (training: with --resume)")
    return 2, f"error: {exc}"


def cli_main(main):
    """Decorate a CLI's `main(argv) -> exit code` with the error handling described in this module."""
    @functools.wraps(main)
    def wrapper(argv=None):
        quiet_device_probe()
        try:
            return main(argv)
        except (*USER_ERRORS, KeyboardInterrupt, OSError) as exc:
            if isinstance(exc, OSError) and exc.errno not in _DISK_ERRNOS:
                return _unexpected()
            code, line = _one_line(exc)
        except Exception:  # a bug: keep the traceback, but never leave other ranks waiting
            return _unexpected()
        if distributed.is_multiprocess_job():
            _pause_unless_rank0()
            print(line, file=sys.stderr)
            distributed.abort_job(code)
        print(line, file=sys.stderr)
        return code

    return wrapper


def _pause_unless_rank0():
    if distributed.launched_rank() != 0:
        time.sleep(_LATE_RANK_PAUSE_S)


def _unexpected():
    if not distributed.is_multiprocess_job():
        raise  # noqa: PLE0704 - re-raised from the except block that called us
    traceback.print_exc()
    distributed.abort_job(1)
