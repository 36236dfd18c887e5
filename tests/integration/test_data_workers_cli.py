"""Training with data worker processes through the CLI: no orphan worker after Ctrl-C / SIGTERM / SIGKILL of
the trainer, a SIGKILLed run resumes identically, and the shipped ImageNet / erasing configs load and run."""
import os
import signal
import subprocess
import time

import psutil
import pytest

from basebn.config import load_config
from tests.support import ROOT
from tests.support.cli import PY, metrics, run
from tests.support.image_folder import folder_config, write_corrupt_png, write_image_folder
from tests.support.signals import default_sigint


@pytest.fixture
def env(tmp_path):
    return dict(os.environ, PYTHONPATH=ROOT, BASEBN_DATA_CACHE=str(tmp_path / "cache"))


def start(cfg, run_dir, env, *args):
    return subprocess.Popen([PY, "-m", "basebn.train", cfg, f"output_dir={run_dir}", *args], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint)


def gone(pid):
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # dead, waiting to be reaped
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_no_orphan_workers_when_the_trainer_is_stopped(tmp_path, env, sig):
    cfg, _ = folder_config(tmp_path)
    proc = start(cfg, tmp_path / "run", env, "solver.max_epoch=100")
    try:
        deadline = time.time() + 120
        workers = []
        while len(workers) < 2:  # the training loader's two workers are up
            assert time.time() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() else ""
            time.sleep(0.2)
            workers = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        proc.send_signal(sig)
        proc.wait(timeout=60)
        deadline = time.time() + 5
        while not all(gone(p) for p in workers) and time.time() < deadline:
            time.sleep(0.1)
        assert all(gone(p) for p in workers), f"orphan workers after {sig.name}: {workers}"
        if sig == signal.SIGINT:
            stderr = proc.stderr.read()
            # (exit 0 here was a run started with SIGINT ignored, e.g. `make test &` from a script: default_sigint)
            assert proc.returncode == 130 and "Traceback" not in stderr, (proc.returncode, stderr[-3000:])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_resume_after_sigkill_with_workers_matches_uninterrupted(tmp_path, env):
    cfg, _ = folder_config(tmp_path)
    full, killed = str(tmp_path / "full"), str(tmp_path / "killed")
    args = ["solver.max_epoch=3"]
    r = run(["basebn.train", cfg, f"output_dir={full}", *args], env=env)
    assert r.returncode == 0, r.stderr
    proc = start(cfg, killed, env, *args)
    latest = os.path.join(killed, "latest.npz")
    deadline = time.time() + 300
    while not os.path.exists(latest) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    r = run(["basebn.train", cfg, f"output_dir={killed}", *args, "--resume"], env=env)
    assert r.returncode == 0, r.stderr
    a, b = metrics(full), metrics(killed)
    assert [m["epoch"] for m in b] == [1, 2, 3]
    assert a[-1] == b[-1]  # identical final metrics


def test_shipped_configs_load_and_imagenet_needs_a_root(tmp_path, env):
    cfg = load_config(os.path.join(ROOT, "configs", "imagenet_resnet50.py"))
    assert (cfg.model.name, cfg.model.stem, cfg.num_classes, cfg.solver.max_epoch) == ("resnet50", "imagenet", 1000, 100)
    assert cfg.solver.basic_lr == pytest.approx(0.1 * cfg.batch_size / 256) and cfg.solver.warmup_epochs == 5
    assert (cfg.loss.label_smooth, cfg.solver.weight_decay, cfg.data.crop_pct) == (0.1, 1e-4, 0.875)
    erasing = load_config(os.path.join(ROOT, "configs", "fmnist_resnet20_erasing.py"))
    assert erasing.data.name == "fashion_mnist" and erasing.data.random_erasing.prob == 0.5
    r = run(["basebn.train", "configs/imagenet_resnet50.py", f"output_dir={tmp_path / 'run2'}"], env=env)
    assert r.returncode == 2 and "data.root" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_imagenet_recipe_runs_two_iterations_on_a_tiny_folder(tmp_path, env):
    root = str(tmp_path / "imagenet")
    write_image_folder(root, per_class=2, size_range=(40, 90))
    r = run(["basebn.train", "configs/imagenet_resnet50.py", f"data.root={root}", f"output_dir={tmp_path / 'run'}",
             "num_classes=3", "batch_size=2",
             "data.image_size=32", "data.max_train_samples=4", "data.max_test_samples=2",
             "data.num_workers=1", "solver.max_epoch=1", "solver.warmup_epochs=0", "log_every_n_iter=1"], env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "iter 2/2" in r.stderr
    assert [m["epoch"] for m in metrics(str(tmp_path / "run"))] == [1]


def test_a_killed_worker_ends_the_run_with_one_line(tmp_path, env):
    cfg, _ = folder_config(tmp_path)
    proc = start(cfg, tmp_path / "run", env, "solver.max_epoch=100")
    try:
        deadline = time.time() + 120
        workers = []
        while len(workers) < 2:
            assert time.time() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() else ""
            time.sleep(0.2)
            workers = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        os.kill(workers[0], signal.SIGKILL)
        err = proc.communicate(timeout=120)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 2 and "Traceback" not in err, err[-3000:]
    assert f"error: data loader worker 0 (pid {workers[0]}) was killed by SIGKILL" in err.strip().splitlines()[-1]


def test_skip_bad_images_warns_each_epoch_and_a_bad_val_image_stops_before_training(tmp_path, env):
    cfg, root = folder_config(tmp_path)
    open(os.path.join(root, "train", "dog", "1.png"), "wb").close()  # an empty file
    write_corrupt_png(os.path.join(root, "val", "emu", "5.png"))  # found only when decoded
    r = run(["basebn.train", cfg, f"output_dir={tmp_path / 'run'}", "data.skip_bad_images=True"], env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    for epoch in (1, 2):
        assert f"replaced by other samples 1 time(s) in epoch {epoch} " in r.stderr, r.stderr[-3000:]
        assert f"1 unreadable image(s) left out of the evaluation after epoch {epoch} " in r.stderr
    assert [m["images"] for m in metrics(str(tmp_path / "run"))] == [17, 17]  # 18 val images, one left out
    jpeg = open(os.path.join(root, "val", "cat", "0.jpg"), "rb").read()
    with open(os.path.join(root, "val", "cat", "0.jpg"), "wb") as f:
        f.write(jpeg[:len(jpeg) // 2])  # truncated
    r = run(["basebn.train", cfg, f"output_dir={tmp_path / 'run2'}"], env=env)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert "0.jpg: truncated JPEG" in r.stderr.strip().splitlines()[-1]
    assert " iter " not in r.stderr  # found before the first training iteration
