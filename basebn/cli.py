"""What every CLI shares: one clear line for what a user can fix, and no rank left waiting.

User errors print `error: ...` and exit 2 (a bad BASEBN_* variable too: checked first, utils/env_vars.py); a full or
read-only disk, or a permission the process lacks, prints one line naming which and exits 1; Ctrl-C prints one line
and exits 130, SIGTERM (what job schedulers send) the same line and 143 (128 + the signal's number, as for Ctrl-C),
even when a finalizer swallowed the exception (the trainer raises it again: utils/interrupts.py). In a multi-process
job a failing rank ends the whole job (MPI_Abort), after a short pause on ranks other than 0 so that rank 0's own
error, when it has one, is the one printed.
"""
import errno
import functools
import os
import signal
import sys
import threading
import time
import traceback

from . import distributed
from .checkpoint import CheckpointError
from .config import ConfigError
from .data import DataError
from .engine.run_dir import RunDirError
from .utils import interrupts
from .utils.cpu_runtime import quiet_device_probe  # (part of this module's API: the CLIs' start)
from .utils.env_vars import EnvVarError, check_environment
from .utils.progress import clear_progress_line
from .zoo import ZooError

__all__ = ["USER_ERRORS", "Terminated", "cli_main", "quiet_device_probe"]

USER_ERRORS = (ConfigError, DataError, CheckpointError, ZooError, RunDirError, EnvVarError)
# what the machine, not the code, got wrong: reported in one line, each with its own advice
_DISK_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, errno.EDQUOT}
_LATE_RANK_PAUSE_S = 0.5
_RESUME_HINT = "a training run continues from its last checkpoint with --resume"


class Terminated(KeyboardInterrupt):
    """Raised in the main thread when SIGTERM arrives, so it ends a run as Ctrl-C does (clean-up runs,
    checkpoints stay intact); a KeyboardInterrupt, so every `except KeyboardInterrupt` treats it alike."""


def _os_error_line(exc):
    """One line for an OSError of _DISK_ERRNOS: what happened, where, and the fix for that errno."""
    where = f": {exc.filename}" if exc.filename else ""
    if exc.errno in (errno.EACCES, errno.EPERM):
        what, fix = f"permission denied{where}", "give this user write access to it (or choose another output_dir)"
    elif exc.errno == errno.EROFS:
        what, fix = f"read-only file system{where}", "write to a writable disk (e.g. another output_dir)"
    elif exc.errno == errno.EDQUOT:
        what, fix = f"disk quota exceeded{where}", "free space within your quota"
    else:
        what, fix = f"disk full (no space left on device){where}", "free space"
    return (f"error: {what}; files written before stay intact (checkpoints are replaced atomically): {fix}, "
            f"then run again (training: with --resume)")


def _one_line(exc):
    if isinstance(exc, Terminated):
        return 128 + signal.SIGTERM, f"terminated (SIGTERM); {_RESUME_HINT}"
    if isinstance(exc, KeyboardInterrupt):
        return 130, f"interrupted; {_RESUME_HINT}"
    if isinstance(exc, OSError) and exc.errno in _DISK_ERRNOS:
        return 1, _os_error_line(exc)
    return 2, f"error: {exc}"


def _raise_terminated(owner_pid):
    """A SIGTERM handler for process `owner_pid`: raise Terminated there (after a write in progress:
    utils/interrupts.py); in a forked child (a data worker) end as an unhandled SIGTERM would."""
    def handler(signum, frame):
        if os.getpid() != owner_pid:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        interrupts.interrupt(Terminated)  # noted: raised again by the trainer if a finalizer swallows this one
    return handler


def _raise_interrupt(signum, frame):
    """Python's own Ctrl-C handler (held back during a write: utils/interrupts.py), plus a note the trainer raises
    again if a finalizer swallows the exception."""
    interrupts.interrupt(KeyboardInterrupt)


def _install_signal_handlers():
    """Make SIGTERM raise Terminated and SIGINT KeyboardInterrupt in this (main) thread, both noted in
    :mod:`.utils.interrupts`; returns ``{signal: previous handler}`` of those installed. A signal ignored at start
    (nohup-like), or SIGINT with a handler other than Python's default, is kept."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    installed = {}
    for sig, handler, replaces in ((signal.SIGTERM, _raise_terminated(os.getpid()), None),
                                   (signal.SIGINT, _raise_interrupt, signal.default_int_handler)):
        previous = signal.getsignal(sig)
        if previous is signal.SIG_IGN or (replaces is not None and previous is not replaces):
            continue
        signal.signal(sig, handler)
        installed[sig] = previous
    return installed


def cli_main(main):
    """Decorate a CLI's `main(argv) -> exit code` with the error handling described in this module."""
    @functools.wraps(main)
    def wrapper(argv=None):
        interrupts.clear()
        installed = _install_signal_handlers()
        try:
            return _reported(main, argv)
        finally:
            for sig, previous in installed.items():
                signal.signal(sig, previous)
            interrupts.clear()

    return wrapper


def _reported(main, argv):
    """Run `main(argv)`; a user error, an interrupt or a disk/permission error becomes one line and an exit code."""
    try:
        try:
            check_environment()  # every BASEBN_* variable, before anything reads one
            quiet_device_probe()
            return main(argv)
        except (*USER_ERRORS, KeyboardInterrupt, OSError) as exc:
            if isinstance(exc, OSError) and exc.errno not in _DISK_ERRNOS:
                return _unexpected()
            code, line = _one_line(exc)
        except Exception:  # a bug: keep the traceback, but never leave other ranks waiting
            return _unexpected()
    except Terminated as exc:  # a second SIGTERM while the first was being handled
        code, line = _one_line(exc)
    clear_progress_line()  # a bar the error cut short: the line starts clean
    if distributed.is_multiprocess_job():
        _pause_unless_rank0()
        print(line, file=sys.stderr)
        distributed.abort_job(code)
    print(line, file=sys.stderr)
    return code


def _pause_unless_rank0():
    if distributed.launched_rank() != 0:
        time.sleep(_LATE_RANK_PAUSE_S)


def _unexpected():
    clear_progress_line()
    if not distributed.is_multiprocess_job():
        raise  # noqa: PLE0704 - re-raised from the except block that called us
    traceback.print_exc()
    distributed.abort_job(1)
