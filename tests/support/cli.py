"""Running the CLIs in a subprocess on a tiny config, and reading what a run wrote."""
import json
import os
import subprocess
import sys

from . import ROOT

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


def write_config(folder, text, name="exp.py"):
    """Write an experiment file `text` into `folder`; returns its path as a str."""
    path = folder / name
    path.write_text(text)
    return str(path)


def run(args, env=None):
    env = env or dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([PY, "-m", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def train_one_epoch(folder):
    """(TINY's path, run directory, stderr) of `python -m basebn.train TINY solver.max_epoch=1` run in `folder`."""
    tiny = write_config(folder, TINY, "tiny.py")
    run_dir = str(folder / "run")
    r = run(["basebn.train", tiny, f"output_dir={run_dir}", "solver.max_epoch=1"])
    assert r.returncode == 0, r.stderr
    return tiny, run_dir, r.stderr


def metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]
