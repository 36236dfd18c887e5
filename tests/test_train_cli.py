"""The CLIs end to end on a tiny config: train, test, resume after SIGKILL, NaN stop, clear user errors."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable

TINY = """
from basebn.config import BaseConfig
class Cfg(BaseConfig):
    def __init__(self):
        super().__init__()
        self.merge(dict(batch_size=16, seed=3,
            data=dict(name="synthetic", image_size=8, train_size=96, test_size=37, pad=1, prefetch=False),
            model=dict(name="resnet20", base_width=4), solver=dict(max_epoch=2, warmup_epochs=1),
            log_every_n_iter=3))
"""


def run(args, env=None):
    env = env or dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([PY, "-m", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny.py"
    path.write_text(TINY)
    return str(path)


def metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_train_then_test_end_to_end(tiny, tmp_path):
    run_dir = str(tmp_path / "run")
    r = run(["basebn.train", tiny, f"output_dir={run_dir}"])
    assert r.returncode == 0, r.stderr
    rows = metrics(run_dir)
    assert [m["epoch"] for m in rows] == [1, 2]
    assert all(m["images"] == 37 and 0 <= m["top1"] <= m["top5"] <= 100 for m in rows)
    for name in ("latest.pkl", "final.pkl", "best.pkl", "epoch_1.pkl", "config.json", "config_diff.json", "log.txt"):
        assert os.path.isfile(os.path.join(run_dir, name)), name
    assert json.load(open(os.path.join(run_dir, "config_diff.json")))["solver.max_epoch"] == 2
    r = run(["basebn.test", tiny, "-w", run_dir, "--json"])
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["images"] == 37
    assert result["top1"] == pytest.approx(rows[-1]["top1"])


def test_resume_after_sigkill_matches_uninterrupted(tiny, tmp_path):
    full, killed = str(tmp_path / "full"), str(tmp_path / "killed")
    args = ["solver.max_epoch=4"]
    assert run(["basebn.train", tiny, f"output_dir={full}", *args]).returncode == 0
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.Popen([PY, "-m", "basebn.train", tiny, f"output_dir={killed}", *args], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    latest = os.path.join(killed, "latest.pkl")
    deadline = time.time() + 300
    while not os.path.exists(latest) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    r = run(["basebn.train", tiny, f"output_dir={killed}", *args, "--resume"])
    assert r.returncode == 0, r.stderr
    a, b = metrics(full), metrics(killed)
    assert [m["epoch"] for m in b] == [1, 2, 3, 4]  # no epoch counted twice
    assert a[-1] == b[-1]  # identical final metrics (CPU is deterministic here)


def test_nan_loss_stops_and_keeps_last_checkpoint(tiny, tmp_path):
    run_dir = str(tmp_path / "run")
    assert run(["basebn.train", tiny, f"output_dir={run_dir}", "solver.max_epoch=1"]).returncode == 0
    before = open(os.path.join(run_dir, "latest.pkl"), "rb").read()
    r = run(["basebn.train", tiny, f"output_dir={run_dir}", "solver.max_epoch=3", "solver.basic_lr=1e30",
             "solver.warmup_epochs=0", "--resume"])
    assert r.returncode == 1
    assert "loss is nan" in r.stderr.lower() or "loss is inf" in r.stderr.lower()
    assert "iteration" in r.stderr
    assert open(os.path.join(run_dir, "latest.pkl"), "rb").read() == before


def test_user_errors_are_one_line(tiny, tmp_path):
    r = run(["basebn.train", tiny, "solver.max_epochs=3"])
    assert r.returncode == 2 and "did you mean 'solver.max_epoch'" in r.stderr and "Traceback" not in r.stderr
    r = run(["basebn.train", str(tmp_path / "missing.py")])
    assert r.returncode == 2 and "does not exist" in r.stderr and "Traceback" not in r.stderr
    r = run(["basebn.train", tiny, "num_classes=3"])
    assert r.returncode == 2 and "num_classes" in r.stderr and "Traceback" not in r.stderr
    r = run(["basebn.train", tiny, "data.name=fashion_mnist", f"data.root={tmp_path}"])
    assert r.returncode == 2 and str(tmp_path) in r.stderr and "Traceback" not in r.stderr


def test_test_cli_rejects_other_architecture_and_corrupt_file(tiny, tmp_path):
    run_dir = str(tmp_path / "run")
    assert run(["basebn.train", tiny, f"output_dir={run_dir}", "solver.max_epoch=1"]).returncode == 0
    r = run(["basebn.test", tiny, "-w", run_dir, "model.name=resnet32"])
    assert r.returncode == 2 and "missing in checkpoint" in r.stderr and "layer1.3" in r.stderr
    bad = tmp_path / "bad.pkl"
    bad.write_bytes(open(os.path.join(run_dir, "final.pkl"), "rb").read()[:100])
    r = run(["basebn.test", tiny, "-w", str(bad)])
    assert r.returncode == 2 and "truncated or corrupt" in r.stderr and "Traceback" not in r.stderr


def test_zoo_export_then_evaluate_and_finetune_from_entry(tiny, tmp_path):
    run_dir, zoo_dir = str(tmp_path / "run"), tmp_path / "zoo"
    zoo_dir.mkdir()
    env = {"BASEBN_ZOO": str(zoo_dir)}
    assert run(["basebn.train", tiny, f"output_dir={run_dir}", "solver.max_epoch=1"]).returncode == 0
    r = run(["basebn.zoo.export", run_dir, "tiny_r20", "--config", tiny, "--command", "test"],
            env=dict(os.environ, PYTHONPATH=ROOT, **env))
    assert r.returncode == 0, r.stderr
    entry = json.loads(r.stdout.strip().splitlines()[-1])
    index = json.load(open(zoo_dir / "zoo.json"))
    assert index["entries"][0]["sha256"] == entry["sha256"] and "tiny_r20" in open(zoo_dir / "README.md").read()
    # the training command given, then the export's own invocation (runnable as recorded: --config included)
    assert entry["command"] == f"test; python -m basebn.zoo.export {run_dir} tiny_r20 --config {tiny}"
    r = run(["basebn.test", "zoo:tiny_r20", "--json"], env=dict(os.environ, PYTHONPATH=ROOT, **env))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["top1"] == pytest.approx(entry["top1"], abs=0.05)
    r = run(["basebn.train", tiny, f"output_dir={tmp_path / 'ft'}", "solver.max_epoch=1", "model.weights=zoo:tiny_r20",
             "bn.norm_eval=True"], env=dict(os.environ, PYTHONPATH=ROOT, **env))
    assert r.returncode == 0, r.stderr
    assert "loaded weights from zoo:tiny_r20" in r.stderr
    with open(zoo_dir / "tiny_r20.npz", "ab") as f:  # a damaged file is refused
        f.write(b"x")
    r = run(["basebn.test", "zoo:tiny_r20"], env=dict(os.environ, PYTHONPATH=ROOT, **env))
    assert r.returncode == 2 and "sha256" in r.stderr and "Traceback" not in r.stderr


def test_trace_flag_trains_like_eager(tiny, tmp_path):
    eager, traced = str(tmp_path / "eager"), str(tmp_path / "traced")
    assert run(["basebn.train", tiny, f"output_dir={eager}", "solver.max_epoch=1"]).returncode == 0
    r = run(["basebn.train", tiny, f"output_dir={traced}", "solver.max_epoch=1", "trace=True"])
    assert r.returncode == 0, r.stderr
    assert metrics(traced)[-1]["loss"] == pytest.approx(metrics(eager)[-1]["loss"], rel=1e-3)
