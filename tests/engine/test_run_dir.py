"""The run directory: lock, refusal to overwrite a previous run, --restart moving it aside, bad paths."""
import os
import signal
import subprocess
import sys

import pytest

from basebn.engine.run_dir import LOCK_NAME, RunDirError, RunDirLock, open_run_dir

HOLDER = """
import sys, time
from basebn.engine.run_dir import RunDirLock
lock = RunDirLock(sys.argv[1])
print("locked", flush=True)
time.sleep(600)
"""


@pytest.fixture
def holder(tmp_path, repo_root):
    """A separate process holding the lock of tmp_path/run; yields (process, run_dir)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir)], stdout=subprocess.PIPE, text=True,
                            cwd=repo_root)
    assert proc.stdout.readline().strip() == "locked"
    yield proc, str(run_dir)
    proc.kill()
    proc.wait()


def test_second_user_is_refused_naming_the_holder(holder):
    proc, run_dir = holder
    with pytest.raises(RunDirError) as info:
        open_run_dir(run_dir, resume=True)
    assert f"process {proc.pid} on " in str(info.value) and "in use" in str(info.value)


def test_lock_of_a_killed_process_does_not_block(holder):
    proc, run_dir = holder
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert os.path.isfile(os.path.join(run_dir, LOCK_NAME))  # the stale file is still there
    lock, _ = open_run_dir(run_dir, resume=True)
    lock.release()


def test_lock_is_released_for_the_next_run(tmp_path):
    first = RunDirLock(str(tmp_path))
    first.release()
    RunDirLock(str(tmp_path)).release()


def test_previous_run_is_refused_and_kept(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text('{"epoch": 1}\n')
    (run_dir / "latest.npz").write_bytes(b"weights")
    with pytest.raises(RunDirError, match="--resume.*--restart"):
        open_run_dir(str(run_dir))
    assert (run_dir / "latest.npz").read_bytes() == b"weights"
    assert (run_dir / "metrics.jsonl").read_text() == '{"epoch": 1}\n'


def test_restart_moves_the_previous_run_aside(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "latest.npz").write_bytes(b"weights")
    (run_dir / "log.txt").write_text("old log")
    lock, moved_to = open_run_dir(str(run_dir), restart=True)
    lock.release()
    assert sorted(os.listdir(moved_to)) == ["latest.npz", "log.txt"]
    assert open(os.path.join(moved_to, "latest.npz"), "rb").read() == b"weights"
    assert os.path.dirname(moved_to) == str(tmp_path) and os.path.basename(moved_to).startswith("run.old-")
    assert [n for n in os.listdir(run_dir) if n != LOCK_NAME] == []


def test_resume_and_empty_directories_are_accepted(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "latest.npz.abc123.tmp").write_bytes(b"partial")  # leftovers do not count as a run
    (tmp_path / "run" / "log.txt").write_text("a start that failed before training")
    lock, moved = open_run_dir(str(tmp_path / "run"))
    lock.release()
    assert moved is None
    lock, _ = open_run_dir(str(tmp_path / "new" / "nested"))
    lock.release()


def test_output_dir_that_is_a_file(tmp_path):
    path = tmp_path / "file"
    path.write_text("mine")
    with pytest.raises(RunDirError, match="is a file"):
        open_run_dir(str(path))
    assert path.read_text() == "mine"


def _mount_tmpfs(path, options):
    path.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")


def test_read_only_output_dir(tmp_path):
    mnt = tmp_path / "ro"
    _mount_tmpfs(mnt, "ro,size=64k")
    try:
        with pytest.raises(RunDirError, match="cannot create output_dir.*Read-only file system"):
            open_run_dir(str(mnt / "run"))
    finally:
        subprocess.run(["umount", str(mnt)])


def test_concurrent_opens_exactly_one_wins(tmp_path, repo_root):
    """Three processes open one run directory; the winner holds it until every process has answered (stdin
    closed), so a slow start of one process cannot see the lock already released."""
    code = ("import sys\nfrom basebn.engine.run_dir import open_run_dir, RunDirError\n"
            "try:\n    lock, _ = open_run_dir(sys.argv[1], resume=True)\n    print('won', flush=True)\n"
            "    sys.stdin.read()\n"
            "except RunDirError:\n    print('refused', flush=True)\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "run")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=repo_root) for _ in range(3)]
    try:
        outs = sorted(p.stdout.readline().strip() for p in procs)
    finally:
        for p in procs:
            p.stdin.close()
            p.wait(timeout=120)
    assert outs == ["refused", "refused", "won"]
