"""A non-editable install carries the kernel sources (the oneDNN conv ops' too) and builds/loads them from its own copy.

`pip install --no-deps --target DIR` of a copy of the source tree, then a fresh interpreter run from
outside the repository with only DIR prepended to its path (megengine from this venv).
"""
import json
import os
import shutil
import subprocess
import sys

import pytest

from basebn.ops import kernel_build, kernel_library
from tests.support import ROOT

_NOT_SOURCES = (".git", ".venv*", "site", "runs", "build", "*.egg-info", "__pycache__", "*.pyc", ".pytest_cache",
                ".cache", ".whl")

PROBE = """
import json, os
import basebn
from basebn.ops import bn_ops, kernel_build, kernel_library
src = kernel_build.kernel_source_dir()
spec = kernel_build.kernel_build_spec(False)
print(json.dumps({"package": os.path.dirname(basebn.__file__), "sources": src,
                  "files": sorted(os.listdir(src)), "build_dir": spec.build_dir, "backend": bn_ops.backend(),
                  "conv": kernel_library.conv_kernel_available()}))
"""


@pytest.mark.slow
def test_installed_package_finds_its_kernels(tmp_path):
    src, site = tmp_path / "src", tmp_path / "site"
    # a copy of the source tree without build outputs (what an sdist would hold, roughly)
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(*_NOT_SOURCES))
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
           "--target", str(site), str(src)]
    res = subprocess.run(pip, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr

    env = dict(os.environ, PYTHONPATH=str(site), BASEBN_BN_BACKEND="auto")
    env.pop("BASEBN_KERNEL_DIR", None)
    res = subprocess.run([sys.executable, "-c", PROBE], cwd=str(tmp_path), env=env, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    info = json.loads(res.stdout.strip().splitlines()[-1])

    assert info["package"] == str(site / "basebn")
    assert info["sources"] == str(site / "basebn" / "ops" / "csrc")
    assert {"bn_ops.cpp", "bn_cpu.cpp", "bn_cuda.cu", "bn_kernels.h", "bn_math.h", "strided_copy.h", "queued_work.h",
            "conv_dnnl.cpp"} <= set(info["files"])
    assert info["files"] == sorted(os.listdir(os.path.join(ROOT, "basebn", "ops", "csrc")))  # every source installed
    # same sources and flags: same cache key as the source tree's, so the cached build is reused
    assert info["build_dir"] == kernel_build.kernel_build_spec(False).build_dir
    if kernel_library.kernel_available():
        assert info["backend"] == "kernel"
    if kernel_library.conv_kernel_available():  # the installed copy's library holds the conv ops too
        assert info["conv"]
