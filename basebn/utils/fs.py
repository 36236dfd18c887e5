"""Files: atomic replacement, clean-up of the temp files a killed writer leaves, sha256 of a file, a file lock.

atomic_write_bytes writes `NAME.XXXXXXXX.tmp` beside `NAME` (8 random characters from mkstemp);
remove_stale_tmp removes exactly that pattern. The file gets the mode a plain open() would give a new file,
0o666 less the user's umask (mkstemp alone would leave 0o600). file_lock is an flock, which the kernel drops when
its process dies (even by SIGKILL), so a lock file left behind never blocks; reliable on local disks, on NFS it
depends on the server.
"""
import contextlib
import hashlib
import os
import re
import tempfile

try:
    import fcntl
except ImportError:  # not POSIX: file_lock does not lock across processes
    fcntl = None

__all__ = ["new_file_problem", "atomic_write_bytes", "remove_stale_tmp", "sha256_of", "current_umask", "new_file_mode",
           "TMP_SUFFIX", "file_lock", "durable_replace", "fsync_dir"]

TMP_SUFFIX = ".tmp"
_STALE_TMP = re.compile(r"^.+\.[a-z0-9_]{8}\.tmp$")  # tempfile.mkstemp's names: 8 of [a-z0-9_]


def current_umask():
    """The process's umask, read without changing it (Linux's /proc/self/status), else by setting it back at once."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def new_file_mode():
    """The permission bits open() gives a new file: 0o666 less the umask."""
    return 0o666 & ~current_umask()


def atomic_write_bytes(path, data):
    """Write `data` to a temp file beside `path`, fsync, then rename: `path` is never half-written."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=TMP_SUFFIX, dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), new_file_mode())  # mkstemp made it 0o600
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    fsync_dir(directory)


def fsync_dir(directory):
    """fsync a folder: a rename into it is then durable."""
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def durable_replace(src, dst):
    """Move the finished file `src` onto `dst` (same folder) after fsyncing it: `dst` is the old file or the
    whole new one, also after a crash."""
    with open(src, "rb") as f:
        os.fsync(f.fileno())
    os.replace(src, dst)
    fsync_dir(os.path.dirname(os.path.abspath(dst)))


@contextlib.contextmanager
def file_lock(path, on_wait=None):
    """Hold an exclusive flock on the file `path` (created when missing, left behind) for the with block.

    When another process holds it, `on_wait()` is called once, then the lock is waited for.
    Locks taken through two opens of one file block each other within one process too.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)  # the umask applies
    try:
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if on_wait is not None:
                    on_wait()
                fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor drops the flock


def remove_stale_tmp(directory):
    """Remove the `NAME.XXXXXXXX.tmp` files a killed atomic_write_bytes left in `directory` (not below it).

    Call it only while no other process writes there (e.g. holding the run directory's lock).
    Returns the removed file names, sorted.
    """
    removed = []
    if not os.path.isdir(directory):
        return removed
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if _STALE_TMP.match(name) and os.path.isfile(path) and not os.path.islink(path):
            os.remove(path)
            removed.append(name)
    return removed


def sha256_of(path, chunk=1 << 20):
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def new_file_problem(path, force=False, suffix=".npz"):
    """Why `path` cannot take a new output file, as a phrase to follow "FLAG 'path': ", or None when it can: the
    name ends in `suffix`, is no directory, does not exist (unless `force`), and its folder exists and takes a new
    file (tried with the atomic writer's own temp name, then removed), so a long run never ends in a write error."""
    if not path.endswith(suffix):
        return f"give a file name ending in {suffix}"
    if os.path.isdir(path):
        return f"is a directory; give a file name ending in {suffix}"
    if os.path.lexists(path) and not force:
        return "exists; give another name or add --force"
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.exists(parent):
        return f"folder {parent!r} does not exist"
    if not os.path.isdir(parent):
        return f"{parent!r} is a file, not a folder"
    try:
        fd, probe = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=TMP_SUFFIX, dir=parent)
        os.close(fd)
        os.remove(probe)
    except OSError as exc:
        return f"cannot write a file in folder {parent!r} ({exc.strerror or exc}); choose a writable folder"
    return None
