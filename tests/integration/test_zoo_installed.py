"""zoo/ is package data: a non-editable install (no source tree) resolves zoo:NAME and loads its weights."""
import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest
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
print(json.dumps({"package": basebn.__file__, "zoo_dir": zoo.zoo_dir(), "weights": zoo.zoo_weights_path(entry),
                  "source": source, "keys": len(state), "conv1": list(state["conv1.weight"].shape)}))
"""


@pytest.mark.slow
def test_installed_package_evaluates_zoo_entries(tmp_path):
    source, target, elsewhere = tmp_path / "src", tmp_path / "site", tmp_path / "elsewhere"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCES)
    elsewhere.mkdir()
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                        "--quiet", "--target", str(target), str(source)], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    env = {k: v for k, v in os.environ.items() if k not in ("BASEBN_ZOO", "PYTHONPATH")}
    r = subprocess.run([sys.executable, "-c", PROBE], cwd=elsewhere, env=dict(env, PYTHONPATH=str(target)),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    installed_zoo = os.path.join(str(target), "basebn", "zoo_data")
    assert got["package"] == os.path.join(str(target), "basebn", "__init__.py")
    assert got["zoo_dir"] == installed_zoo and got["source"] == "zoo:fmnist_r20"
    assert got["weights"] == os.path.join(installed_zoo, "fmnist_r20.npz")
    with open(os.path.join(ROOT, "zoo", "zoo.json")) as f:
        shipped = {e["name"]: e for e in json.load(f)["entries"]}
    for name, entry in shipped.items():  # every shipped weights file is installed, byte for byte
        with open(os.path.join(installed_zoo, entry["weights"]), "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest() == entry["sha256"], name
    assert got["keys"] > 50 and got["conv1"][0] == 16
