"""basebn.cli's one-line reports, in-process: each OSError errno gets its own message (a permission error is not
called a full disk), and SIGTERM ends a CLI as Ctrl-C does (exit 143 = 128 + 15, as 130 = 128 + 2)."""
import errno
import multiprocessing
import os
import signal
import time

import pytest

from basebn.cli import cli_main


def report(exc, capsys):
    """(exit code, stderr lines) of a CLI whose main raises `exc`."""
    @cli_main
    def main(argv=None):
        raise exc

    code = main([])
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize("err, words, not_words", [
    (errno.EACCES, "error: permission denied: /runs/x/latest.npz;", ("disk full", "free space")),
    (errno.EPERM, "error: permission denied: /runs/x/latest.npz;", ("disk full", "free space")),
    (errno.ENOSPC, "error: disk full (no space left on device): /runs/x/latest.npz;", ("permission",)),
    (errno.EROFS, "error: read-only file system: /runs/x/latest.npz;", ("permission", "disk full")),
    (errno.EDQUOT, "error: disk quota exceeded: /runs/x/latest.npz;", ("permission",)),
])
def test_each_os_error_is_named_for_what_it_is(capsys, err, words, not_words):
    code, lines = report(OSError(err, os.strerror(err), "/runs/x/latest.npz"), capsys)
    assert code == 1 and len(lines) == 1 and lines[0].startswith(words), lines
    assert not any(w in lines[0] for w in not_words), lines
    assert "--resume" in lines[0]


def test_permission_error_says_what_to_fix(capsys):
    _, lines = report(PermissionError(errno.EACCES, "Permission denied", "/runs/x"), capsys)
    assert "write access" in lines[0]


def test_sigterm_ends_like_ctrl_c_with_exit_143(capsys):
    @cli_main
    def main(argv=None):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)  # the handler raises in here
        return 0

    class NotHandled(Exception):
        pass

    def fallback(signum, frame):  # what runs if cli_main did not take SIGTERM over (instead of killing pytest)
        raise NotHandled()

    before = signal.signal(signal.SIGTERM, fallback)
    try:
        assert main([]) == 128 + signal.SIGTERM == 143
        assert signal.getsignal(signal.SIGTERM) is fallback  # the previous handler is back
    finally:
        signal.signal(signal.SIGTERM, before)
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == ["terminated (SIGTERM); a training run continues from its last checkpoint with --resume"]


def _sleep():
    time.sleep(30)


def test_a_forked_child_still_dies_by_sigterm(capsys):
    """A data worker forked inside a CLI (it inherits the handler) ends on SIGTERM as it did before, not by
    raising in the worker."""
    @cli_main
    def main(argv=None):
        child = multiprocessing.get_context("fork").Process(target=_sleep)
        child.start()
        time.sleep(0.2)
        child.terminate()
        child.join(10)
        return child.exitcode

    assert main([]) == -signal.SIGTERM
    assert "Traceback" not in capsys.readouterr().err
