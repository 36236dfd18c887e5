"""zoo/ and configs/ are package data: a non-editable install, run from a directory outside the checkout (no
source tree, no configs/ in the working directory), resolves zoo:NAME, evaluates it to its recorded top-1,
fine-tunes from it (model.weights=zoo:NAME) and deploys it."""
import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest
from basebn.data.idx import FASHION_MNIST_DEFAULT_ROOT
from tests.support import ROOT

# what a checkout holds besides the sources; copied without them, so the build leaves nothing in the working tree
NOT_SOURCES = shutil.ignore_patterns(".git", ".venv", "runs", "build", "*.egg-info", "__pycache__", ".pytest_cache",
                                     ".cache", ".lock")

PROBE = """
import json, sys
import basebn, basebn.zoo as zoo
from basebn.models import read_weights
entry = zoo.get_entry("fmnist_r20")
state, source = read_weights("zoo:fmnist_r20")
path, overrides = zoo.zoo_config_source("fmnist_r20")
print(json.dumps({"package": basebn.__file__, "zoo_dir": zoo.zoo_dir(), "weights": zoo.zoo_weights_path(entry),
                  "config": path, "source": source, "keys": len(state), "conv1": list(state["conv1.weight"].shape)}))
"""

# a user's own fine-tuning config, written outside the checkout: the zoo model's architecture on a slice of the data
FINETUNE = """
from basebn.config import BaseConfig
class Cfg(BaseConfig):
    def __init__(self):
        super().__init__()
        self.merge(dict(batch_size=32, data=dict(name="fashion_mnist", max_train_samples=64, max_test_samples=64,
                                                 num_workers=0),
                        model=dict(name="resnet20", base_width=16, stem_stride=2, weights="zoo:fmnist_r20"),
                        solver=dict(max_epoch=1, warmup_epochs=0, basic_lr=0.01), model_ema=dict(enabled=False)))
"""


def _run(args, cwd, env):
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_installed_package_evaluates_zoo_entries(tmp_path):
    source, target, elsewhere = tmp_path / "src", tmp_path / "site", tmp_path / "elsewhere"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCES)
    elsewhere.mkdir()
    assert os.path.commonpath([str(elsewhere), ROOT]) != ROOT  # outside the checkout
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                        "--quiet", "--target", str(target), str(source)], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    env = {k: v for k, v in os.environ.items() if k not in ("BASEBN_ZOO", "PYTHONPATH")}
    env = dict(env, PYTHONPATH=str(target))
    r = _run(["-c", PROBE], elsewhere, env)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    installed_zoo = os.path.join(str(target), "basebn", "zoo_data")
    assert got["package"] == os.path.join(str(target), "basebn", "__init__.py")
    assert got["zoo_dir"] == installed_zoo and got["source"] == "zoo:fmnist_r20"
    assert got["weights"] == os.path.join(installed_zoo, "fmnist_r20.npz")
    assert got["config"] == os.path.join(installed_zoo, "configs", "fmnist_resnet20.py")
    with open(os.path.join(ROOT, "zoo", "zoo.json")) as f:
        shipped = {e["name"]: e for e in json.load(f)["entries"]}
    for name, entry in shipped.items():  # every shipped weights file and config is installed, byte for byte
        with open(os.path.join(installed_zoo, entry["weights"]), "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest() == entry["sha256"], name
        for config, sha in entry["config_sha256"].items():
            with open(os.path.join(installed_zoo, config), "rb") as f:
                assert hashlib.sha256(f.read()).hexdigest() == sha, (name, config)
    assert got["keys"] > 50 and got["conv1"][0] == 16

    if not os.path.isdir(FASHION_MNIST_DEFAULT_ROOT):
        pytest.skip("Fashion-MNIST not installed (apt-get install dataset-fashion-mnist): evaluation, deployment and "
                    "fine-tuning")
    out = elsewhere / "fmnist_r20.onnx"
    r = _run(["-m", "basebn.deploy", "zoo:fmnist_r20", "--format", "onnx", "-o", str(out), "--verify"], elsewhere, env)
    assert r.returncode == 0 and out.is_file(), r.stderr[-3000:]
    r = _run(["-m", "basebn.test", "zoo:fmnist_r20", "--json"], elsewhere, env)
    assert r.returncode == 0, r.stderr[-3000:]
    metrics = json.loads(r.stdout.strip().splitlines()[-1])
    assert metrics["images"] == 10000 and abs(metrics["top1"] - shipped["fmnist_r20"]["top1"]) <= 0.05
    (elsewhere / "finetune.py").write_text(FINETUNE)
    r = _run(["-m", "basebn.train", "finetune.py", f"output_dir={elsewhere / 'ft'}"], elsewhere, env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "loaded weights from zoo:fmnist_r20" in r.stderr
    assert os.path.isfile(elsewhere / "ft" / "final.npz")
