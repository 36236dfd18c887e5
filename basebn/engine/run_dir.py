"""The run directory: one training in it at a time, and a previous run is never overwritten.

The lock is an flock on RUN_DIR/.lock, so the kernel releases it when its process dies (even by SIGKILL):
a stale lock file never blocks. flock is reliable on local disks; on NFS it depends on the server.
"""
import datetime
import fcntl
import os
import socket
import sys

__all__ = ["RunDirError", "RunDirLock", "open_run_dir", "previous_run_files", "check_not_in_use", "LOCK_NAME"]

LOCK_NAME = ".lock"
RUN_RECORDS = ("config.json", "config_diff.json", "metrics.jsonl")
CHECKPOINT_SUFFIXES = (".npz", ".pkl")


class RunDirError(RuntimeError):
    """The run directory cannot be used as asked; the message says what to do."""


class RunDirLock:
    """Holds RUN_DIR/.lock until release() or the end of the process."""

    def __init__(self, run_dir):
        self.path = os.path.join(run_dir, LOCK_NAME)
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)  # less the umask, as open() does
        except OSError as exc:
            raise RunDirError(f"cannot write in output_dir {run_dir!r} ({exc.strerror}); "
                              f"choose a writable output_dir") from None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            error = _in_use_error(run_dir, self._fd)
            os.close(self._fd)
            raise error from None
        os.ftruncate(self._fd, 0)
        started = datetime.datetime.now().isoformat(timespec="seconds")
        os.pwrite(self._fd, f"process {os.getpid()} on {socket.gethostname()} (started {started}: "
                            f"{' '.join(sys.argv)})\n".encode(), 0)

    def release(self):
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None


def _in_use_error(run_dir, fd):
    holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "another process"
    return RunDirError(f"output_dir {run_dir!r} is in use by {holder}; wait for it to finish, stop it, "
                       f"or choose another output_dir")


def check_not_in_use(run_dir):
    """Raise RunDirError naming the holder when a training holds run_dir's lock now; nothing is written (for
    checks that read the run before taking the lock)."""
    try:
        fd = os.open(os.path.join(run_dir, LOCK_NAME), os.O_RDONLY)
    except OSError:
        return  # no lock file: no training has held it
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _in_use_error(run_dir, fd) from None
    finally:
        os.close(fd)  # closing drops the shared lock


def _own_files(run_dir):
    """Every name in run_dir but the lock and leftover *.tmp files."""
    if not os.path.isdir(run_dir):
        return []
    return sorted(n for n in os.listdir(run_dir) if n != LOCK_NAME and not n.endswith(".tmp"))


def previous_run_files(run_dir):
    """What a previous run left that a new one would replace: config, metrics, checkpoints (.npz, .pkl).

    A log.txt alone (a start that failed before training) is not a run: the next run appends to it.
    """
    return [n for n in _own_files(run_dir) if n in RUN_RECORDS or n.endswith(CHECKPOINT_SUFFIXES)]


def _move_aside(run_dir, names):
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    target = f"{os.path.normpath(run_dir)}.old-{stamp}"
    suffix = 1
    while os.path.exists(target):
        target = f"{os.path.normpath(run_dir)}.old-{stamp}-{suffix}"
        suffix += 1
    os.makedirs(target)
    for name in names:
        os.rename(os.path.join(run_dir, name), os.path.join(target, name))
    return target


def open_run_dir(run_dir, resume=False, restart=False):
    """Create/lock run_dir for a training; returns (RunDirLock, moved_to or None).

    Without resume or restart a directory holding a previous run is refused; restart moves the previous
    run's files to RUN_DIR.old-TIMESTAMP (nothing is deleted).
    """
    if os.path.exists(run_dir) and not os.path.isdir(run_dir):
        raise RunDirError(f"output_dir {run_dir!r} is a file, not a directory; choose another output_dir")
    try:
        os.makedirs(run_dir, exist_ok=True)
    except OSError as exc:
        raise RunDirError(f"cannot create output_dir {run_dir!r} ({exc.strerror}); "
                          f"choose a writable output_dir") from None
    lock = RunDirLock(run_dir)
    try:
        old = previous_run_files(run_dir)
        moved_to = None
        if old and restart:
            moved_to = _move_aside(run_dir, _own_files(run_dir))
        elif old and not resume:
            shown = ", ".join(old[:6]) + (", ..." if len(old) > 6 else "")
            raise RunDirError(f"output_dir {run_dir!r} already holds a run ({shown}); continue it with --resume, "
                              f"start over with --restart (moves it to {os.path.normpath(run_dir)}.old-TIMESTAMP), "
                              f"or set output_dir=... to a new directory")
    except BaseException:
        lock.release()
        raise
    return lock, moved_to
