"""What a demanding user tries: re-running a command, two runs on one directory, Ctrl-C, bad values, a
full disk, MPI with a failing rank, a hostfile. Each once lost data, hung or printed a traceback."""
import glob
import os
import shutil
import signal
import subprocess
import time

import pytest

from tests.support.mpi_launch import ROOT, find_mpiexec
from basebn.config import ConfigError
from basebn.train import launcher_options
from tests.support.cli import PY, TINY, metrics, run, train_one_epoch
from tests.support.cli_batch import run_mains
from tests.support.signals import default_sigint

# overrides that make TINY's training cheaper where the case needs a training but not TINY's 6 steps an epoch
ONE_STEP = ("data.train_size=16", "data.test_size=16")
TWO_STEPS = ("data.train_size=32",)


@pytest.fixture(scope="module")
def one_epoch(tmp_path_factory):
    """(config path, run directory, stderr) of `python -m basebn.train TINY solver.max_epoch=1`: tests that need
    such a run copy it."""
    return train_one_epoch(tmp_path_factory.mktemp("one_epoch"))


def snapshot(run_dir):
    """{name: bytes} of the files a run left (the lock file excluded)."""
    return {os.path.basename(p): open(p, "rb").read() for p in glob.glob(os.path.join(run_dir, "*"))
            if os.path.isfile(p)}


def test_rerunning_a_command_never_destroys_the_previous_run(one_epoch, tmp_path):
    tiny, run_dir = one_epoch[0], str(tmp_path / "run")
    shutil.copytree(one_epoch[1], run_dir)  # what the command wrote
    before = snapshot(run_dir)
    r = run(["basebn.train", tiny, f"output_dir={run_dir}", "solver.max_epoch=1"])
    assert r.returncode == 2 and "--resume" in r.stderr and "--restart" in r.stderr and "Traceback" not in r.stderr
    assert snapshot(run_dir) == before


def test_restart_moves_the_previous_run_aside(one_epoch, tmp_path):
    tiny, run_dir = one_epoch[0], str(tmp_path / "run")
    shutil.copytree(one_epoch[1], run_dir)
    before = snapshot(run_dir)
    r = run(["basebn.train", tiny, f"output_dir={run_dir}", "solver.max_epoch=1", "--restart", *ONE_STEP])
    assert r.returncode == 0, r.stderr
    (old,) = glob.glob(run_dir + ".old-*")
    assert snapshot(old) == before
    assert [row["epoch"] for row in metrics(run_dir)] == [1]


def test_second_training_on_a_directory_in_use_is_refused(tiny, tmp_path):
    run_dir = str(tmp_path / "run")
    first = subprocess.Popen([PY, "-m", "basebn.train", tiny, f"output_dir={run_dir}", "solver.max_epoch=50"],
                             cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), stderr=subprocess.DEVNULL)
    try:
        lock = os.path.join(run_dir, ".lock")
        deadline = time.time() + 120
        while not (os.path.isfile(lock) and open(lock).read().strip()):
            assert time.time() < deadline and first.poll() is None, "the first run never took the lock"
            time.sleep(0.2)
        first.send_signal(signal.SIGSTOP)  # stopped, it holds the lock and leaves the cores to the second
        r = run(["basebn.train", tiny, f"output_dir={run_dir}", "--resume"])
        assert r.returncode == 2 and f"in use by process {first.pid}" in r.stderr and "Traceback" not in r.stderr
    finally:
        first.kill()
        first.wait()
    r = run(["basebn.train", tiny, f"output_dir={run_dir}", "solver.max_epoch=1", "--restart", *ONE_STEP])
    assert r.returncode == 0, r.stderr  # the killed run's lock does not block


def test_ctrl_c_is_one_line(tiny, tmp_path):
    proc = subprocess.Popen([PY, "-m", "basebn.train", tiny, f"output_dir={tmp_path / 'run'}", "solver.max_epoch=50",
                             *TWO_STEPS], cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), stderr=subprocess.PIPE,
                            text=True, preexec_fn=default_sigint)
    deadline = time.time() + 120
    while not glob.glob(str(tmp_path / "run" / "metrics.jsonl")):  # training is under way
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "--resume" in err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err


def start_training(tiny, run_dir, *args):
    """A training of 50 epochs, returned once its first evaluation is written (training is under way)."""
    proc = subprocess.Popen([PY, "-m", "basebn.train", tiny, f"output_dir={run_dir}", "solver.max_epoch=50", *args],
                            cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not os.path.exists(os.path.join(run_dir, "latest.npz")):
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.2)
    return proc


def test_sigterm_is_one_line_exit_143_and_the_run_resumes(tiny, tmp_path):
    """What a job scheduler sends at the end of a time limit: ends as Ctrl-C does, and --resume continues."""
    run_dir = str(tmp_path / "run")
    proc = start_training(tiny, run_dir, *TWO_STEPS)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-2000:]
    assert err.strip().splitlines()[-1] == ("terminated (SIGTERM); a training run continues from its last "
                                            "checkpoint with --resume")
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    done = [row["epoch"] for row in metrics(run_dir)]
    r = run(["basebn.train", tiny, f"output_dir={run_dir}", f"solver.max_epoch={done[-1] + 1}", *TWO_STEPS, "--resume",
             "--allow-config-change"])
    assert r.returncode == 0, r.stderr
    assert [row["epoch"] for row in metrics(run_dir)] == list(range(1, done[-1] + 2))


@pytest.mark.parametrize("umask", [0o002, 0o077])
def test_run_files_honour_the_umask(tiny, tmp_path, umask):
    run_dir = tmp_path / "run"
    r = subprocess.run([PY, "-m", "basebn.train", tiny, f"output_dir={run_dir}", "solver.max_epoch=1", *ONE_STEP],
                       cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True, timeout=600,
                       preexec_fn=lambda: os.umask(umask))
    assert r.returncode == 0, r.stderr
    names = sorted(os.listdir(run_dir))
    assert {"latest.npz", "final.npz", "config.json", "metrics.jsonl", "log.txt", ".lock"} <= set(names)
    modes = {name: oct(os.stat(run_dir / name).st_mode & 0o777) for name in names}
    assert modes == {name: oct(0o666 & ~umask) for name in names}  # as `touch` would make them


BAD_VALUES = [("solver.basic_lr=nan", "solver.basic_lr"), ("solver.max_epoch=inf", "solver.max_epoch"),
              ("model.name=resnet99", "model.name"), ("batch_size=2.5", "batch_size")]


@pytest.fixture(scope="module")
def refused(tmp_path_factory):
    """The trainings refused at their start, in one process (tests/support/cli_batch.py): {case: (result, the
    output_dir it was given)}, a case being a BAD_VALUES override or "file" (output_dir is a file holding
    "keep me")."""
    folder = tmp_path_factory.mktemp("refused")
    tiny = folder / "tiny.py"
    tiny.write_text(TINY)
    notes = folder / "notes.txt"
    notes.write_text("keep me")
    cases = {override: ([override], folder / f"run_{i}") for i, (override, _) in enumerate(BAD_VALUES)}
    cases["file"] = ([], notes)
    results = run_mains([("basebn.train", [str(tiny), *args, f"output_dir={out}"]) for args, out in cases.values()])
    return {case: (r, out) for (case, (_, out)), r in zip(cases.items(), results)}


@pytest.mark.parametrize("override, key", BAD_VALUES)
def test_bad_values_exit_2_with_one_line(refused, override, key):
    r, run_dir = refused[override]
    assert r.returncode == 2 and key in r.stderr and "Traceback" not in r.stderr
    assert not os.path.exists(run_dir)  # refused before anything was written


def test_output_dir_that_is_a_file(refused):
    r, path = refused["file"]
    assert r.returncode == 2 and "is a file" in r.stderr and "Traceback" not in r.stderr
    assert path.read_text() == "keep me"


def test_cpu_device_probe_noise_is_silenced(one_epoch):
    stderr = one_epoch[2]  # a training's
    assert "failed to load cuda func" not in stderr and "Failed to load CUDA driver" not in stderr


def test_nan_before_any_checkpoint_does_not_claim_one(tiny, tmp_path):
    r = run(["basebn.train", tiny, f"output_dir={tmp_path / 'run'}", "solver.basic_lr=1e30", "solver.warmup_epochs=0"])
    assert r.returncode == 1 and "No checkpoint had been written yet" in r.stderr and "intact" not in r.stderr


# ----------------------------------------------------------------------------------- full disk
@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)])


def fill(mnt, leave_bytes):
    stat = os.statvfs(mnt)
    free = stat.f_bavail * stat.f_frsize
    with open(os.path.join(mnt, "filler"), "wb") as f:
        f.write(b"\0" * max(0, free - leave_bytes))


def test_full_disk_during_a_checkpoint_is_one_line_and_keeps_the_last_one(one_epoch, small_disk):
    tiny, run_dir = one_epoch[0], str(small_disk / "run")
    shutil.copytree(one_epoch[1], run_dir)
    before = snapshot(run_dir)
    fill(small_disk, 16 << 10)
    r = run(["basebn.train", tiny, f"output_dir={run_dir}", "solver.max_epoch=2", "--resume", "--allow-config-change"])
    assert r.returncode == 1 and "disk full (no space left on device)" in r.stderr and "Traceback" not in r.stderr
    after = snapshot(run_dir)
    for name in before:
        if name not in ("log.txt", "metrics.jsonl", "config.json", "config_diff.json"):
            assert after[name] == before[name], name  # every checkpoint of epoch 1 is intact


@pytest.mark.mpi
def test_mpi_a_failing_rank_ends_the_whole_job(one_epoch, small_disk):
    """Rank 0 cannot write its checkpoint: every rank must end within seconds, the error printed once."""
    tiny, run_dir = one_epoch[0], str(small_disk / "run")
    shutil.copytree(one_epoch[1], run_dir)
    fill(small_disk, 16 << 10)
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    cmd = [find_mpiexec(), "-n", "2", PY, "-m", "basebn.train", tiny, f"output_dir={run_dir}", "solver.max_epoch=3",
           "--resume", "--allow-config-change"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("a rank kept running after rank 0 failed (the job hung)")
    assert proc.returncode != 0
    assert out.count("no space left on device") == 1, out[-3000:]


@pytest.mark.mpi
def test_mpi_sigterm_ends_every_rank_with_one_line(tiny, tmp_path):
    """SIGTERM to mpiexec (as a scheduler sends it): MPICH forwards it, the job ends with 143 and the one line."""
    run_dir = str(tmp_path / "run")
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    cmd = [find_mpiexec(), "-n", "2", PY, "-m", "basebn.train", tiny, f"output_dir={run_dir}", "solver.max_epoch=50"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        deadline = time.time() + 120
        while not os.path.exists(os.path.join(run_dir, "latest.npz")):
            assert time.time() < deadline and proc.poll() is None
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("the job kept running after SIGTERM")
    assert proc.returncode == 143, out[-3000:]
    assert out.count("terminated (SIGTERM); a training run continues from its last checkpoint with --resume") >= 1
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out[-3000:]


@pytest.mark.mpi
def test_mpi_hostfile_run(tiny, tmp_path):
    """Two 'hosts' on loopback through a hostfile: the multi-machine MPI path."""
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost:1\n127.0.0.1:1\n")
    run_dir = str(tmp_path / "run")
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    cmd = [find_mpiexec(), "-f", str(hostfile), "-n", "2", PY, "-m", "basebn.train", tiny, f"output_dir={run_dir}",
           "solver.max_epoch=1"]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "2 process(es), backend mpi" in open(os.path.join(run_dir, "log.txt")).read()
    assert [row["epoch"] for row in metrics(run_dir)] == [1]


def test_launcher_options_for_several_machines():
    assert launcher_options(4) == dict(n_gpus=4, world_size=4, rank_start=0)
    assert launcher_options(8, 2, 1, "tcp://10.0.0.1:23456") == dict(
        n_gpus=8, world_size=16, rank_start=8, master_ip="10.0.0.1", port=23456)
    for bad in [(8, 2, 1, None), (8, 2, 1, "10.0.0.1:23456"), (8, 2, 1, "tcp://10.0.0.1"), (8, 2, 2, "tcp://h:1")]:
        with pytest.raises(ConfigError):
            launcher_options(*bad)
