"""Files basebn writes get the mode a plain open() gives a new file: 0o666 less the user's umask (atomic writes
went through mkstemp and were always 0o600)."""
import os
import stat

import pytest

from basebn.engine.run_dir import RunDirLock
from basebn.utils.fs import atomic_write_bytes, current_umask


@pytest.fixture(params=[0o002, 0o022, 0o077])
def umask(request):
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_current_umask_reads_without_changing_it(umask):
    assert current_umask() == umask and current_umask() == umask


def test_atomic_write_honours_the_umask(tmp_path, umask):
    reference = tmp_path / "plain.bin"
    with open(reference, "wb") as f:  # the reference: what open() gives a new file under this umask
        f.write(b"x")
    path = tmp_path / "atomic.bin"
    atomic_write_bytes(str(path), b"data")
    assert mode(path) == mode(reference) == 0o666 & ~umask
    atomic_write_bytes(str(path), b"again")  # a replacement too
    assert mode(path) == 0o666 & ~umask and path.read_bytes() == b"again"


def test_run_dir_lock_honours_the_umask(tmp_path, umask):
    lock = RunDirLock(str(tmp_path))
    try:
        assert mode(lock.path) == 0o666 & ~umask
    finally:
        lock.release()
