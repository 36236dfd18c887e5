"""The kernel library's cache: a damaged cached library is never mapped (rebuilt with one warning, or left unloaded in a
read-only cache), a read-only cache with a valid build loads it, and a failed oneDNN build's record stands only while
the sources, flags and compiler that failed are the ones in use.

Each subprocess test works on a copy of this process's built cache in tmp_path ($BASEBN_KERNEL_CACHE): no compile,
only a relink where the library was damaged (seconds). A read-only cache is simulated inside the subprocess: every
write under the cache folder fails with EROFS, as on a read-only mount (a chmod does not stop root).
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest

from basebn.ops import kernel_build, kernel_library
from tests.support import ROOT
from tests.support.ninja_dates import redate_build

PROBE = """
import numpy as np, megengine as mge
from basebn.ops import bn_ops, kernel_library
from basebn.layers.conv import conv2d
y = conv2d(mge.tensor(np.ones((1, 2, 4, 4), np.float32)), mge.tensor(np.ones((3, 2, 3, 3), np.float32)), padding=1)
print("RESULT", bn_ops.backend(), kernel_library.conv_kernel_available(), float(y.numpy()[0, 0, 1, 1]))
"""

READ_ONLY = """
import builtins, errno, os
_root = os.path.realpath(os.environ["BASEBN_KERNEL_CACHE"])

def _inside(path):
    path = os.path.realpath(os.fsdecode(path))
    return path == _root or path.startswith(_root + os.sep)

def _erofs(path):
    return OSError(errno.EROFS, os.strerror(errno.EROFS), os.fsdecode(path))

def _guard(fn, writes):
    def guarded(path, *args, **kwargs):
        if _inside(path) and writes(*args, **kwargs):
            if fn is os.mkdir and os.path.lexists(path):
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), os.fsdecode(path))
            raise _erofs(path)
        return fn(path, *args, **kwargs)
    return guarded

_write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
builtins.open = _guard(builtins.open, lambda mode="r", *a, **k: any(c in mode for c in "wax+"))
os.open = _guard(os.open, lambda flags, *a, **k: bool(flags & _write_flags))
for _name in ("remove", "unlink", "mkdir", "rmdir", "chmod", "utime"):
    setattr(os, _name, _guard(getattr(os, _name), lambda *a, **k: True))

def _guard_move(fn):
    def guarded(src, dst, *args, **kwargs):
        if _inside(src) or _inside(dst):
            raise _erofs(dst)
        return fn(src, dst, *args, **kwargs)
    return guarded

for _name in ("rename", "replace"):
    setattr(os, _name, _guard_move(getattr(os, _name)))
"""


def _sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@pytest.fixture
def cache_copy(tmp_path):
    """A copy of this process's built kernel cache: (cache root, build dir, library path, the library's bytes).

    The copy is in the state right after its build: its objects, and the times ninja recorded for them, are dated
    after every source and header they were compiled from (:func:`redate_build`), so a rebuild only relinks, also
    where the cache was built from an earlier checkout of the same sources (its key hashes contents, not times)."""
    lib = kernel_library.kernel_library()
    if lib is None or not lib.get("conv"):
        pytest.skip(f"the kernel library with oneDNN is not built here: {kernel_library.kernel_error()}")
    build_dir = tmp_path / "cache" / os.path.basename(lib["build_dir"])
    shutil.copytree(lib["build_dir"], build_dir, ignore=shutil.ignore_patterns("selfcheck-*", "build.flock", "lock"))
    redate_build(str(build_dir))
    path = build_dir / os.path.basename(lib["path"])
    return tmp_path / "cache", build_dir, path, path.read_bytes()


def _probe(cache, read_only=False):
    env = dict(os.environ, BASEBN_KERNEL_CACHE=str(cache), PYTHONPATH=ROOT, BASEBN_CONV_BACKEND="auto")
    for var in ("BASEBN_KERNEL_DIR", "BASEBN_ONEDNN_ROOT", "BASEBN_BN_BACKEND"):
        env.pop(var, None)
    res = subprocess.run([sys.executable, "-c", (READ_ONLY if read_only else "") + PROBE], env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, f"exit {res.returncode}\n{res.stdout}\n{res.stderr}"
    result = [ln for ln in res.stdout.splitlines() if ln.startswith("RESULT")][-1].split()[1:]
    warnings = [ln for ln in res.stderr.splitlines() if "WARNING" in ln]
    return result, warnings


@pytest.mark.parametrize("kept", [0.5, 0.0])
def test_a_truncated_cached_library_is_rebuilt_with_one_warning_never_mapped(cache_copy, kept):
    """A truncated .so was mapped and killed the process with SIGBUS (exit 135); an empty one was recorded as a
    failed oneDNN build and kept the conv ops off for good."""
    cache, build_dir, path, original = cache_copy
    os.truncate(path, int(len(original) * kept))
    result, warnings = _probe(cache)
    assert result == ["kernel", "True", "18.0"]  # 2 channels x 9 taps of ones, on the oneDNN conv op
    assert len(warnings) == 1 and str(path) in warnings[0] and "rebuilding" in warnings[0], warnings
    assert path.stat().st_size == len(original)
    record = json.loads((build_dir / "built.ok").read_text())
    assert (record["size"], record["sha256"]) == (len(original), _sha256(path))
    assert not (build_dir / "dnnl_failed.txt").exists()


def test_a_read_only_cache_with_a_valid_build_loads_it(cache_copy):
    cache, build_dir, path, original = cache_copy
    result, warnings = _probe(cache, read_only=True)
    assert result == ["kernel", "True", "18.0"] and warnings == []
    assert path.read_bytes() == original and not (build_dir / "dnnl_failed.txt").exists()


def test_a_damaged_library_in_a_read_only_cache_is_not_mapped_and_the_warning_says_so(cache_copy):
    cache, build_dir, path, original = cache_copy
    os.truncate(path, len(original) // 2)
    result, warnings = _probe(cache, read_only=True)
    assert result == ["fallback", "False", "18.0"]  # MegEngine's conv and BN: same numbers
    assert warnings and all("read-only" in w and "truncated" in w and "dnnl_failed" not in w for w in warnings)


def test_a_failure_record_of_another_compiler_is_dropped_and_the_conv_ops_load(cache_copy):
    """A build that failed with another compiler (one since repaired, say) no longer keeps the conv ops off."""
    cache, build_dir, path, original = cache_copy
    record = build_dir / "dnnl_failed.txt"
    record.write_text(json.dumps({"key": {"compiler": "/opt/broken/bin/c++", "compiler_version": "broken-c++ 0.1"},
                                  "reason": "the build with oneDNN failed: conv_dnnl.cpp: error: boom"}))
    result, warnings = _probe(cache)
    assert result == ["kernel", "True", "18.0"] and warnings == []
    assert not record.exists()


# --------------------------------------------------------------------------- the failure record's key, as functions
@pytest.fixture
def dnnl_spec(tmp_path, monkeypatch):
    """The oneDNN build spec in an empty cache under tmp_path."""
    monkeypatch.setenv("BASEBN_KERNEL_CACHE", str(tmp_path / "cache"))
    for var in ("BASEBN_KERNEL_DIR", "BASEBN_ONEDNN_ROOT"):
        monkeypatch.delenv(var, raising=False)
    onednn = kernel_build.find_onednn()
    if onednn is None:
        pytest.skip("oneDNN not found")
    spec = kernel_build.kernel_build_spec(False, onednn=onednn)
    os.makedirs(spec.build_dir)
    return spec


def _fake_compiler(folder, version):
    path = folder / f"c++-{version.split()[-1]}"
    path.write_text(f"#!/bin/sh\necho '{version}'\n")
    path.chmod(0o755)
    return str(path)


def test_a_recorded_failure_holds_for_the_same_toolchain(dnnl_spec):
    assert kernel_build.record_onednn_build_failure(dnnl_spec, "conv_dnnl.cpp: error: boom")
    assert kernel_build.recorded_onednn_failure(dnnl_spec) == "conv_dnnl.cpp: error: boom"
    assert kernel_build.kernel_build_spec(False).onednn is None  # the BN-only library
    reason = kernel_build.no_onednn_reason(False)
    assert "boom" in reason and "dnnl_failed.txt" in reason


def test_a_recorded_failure_expires_with_another_compiler(dnnl_spec, tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", _fake_compiler(tmp_path, "fake-c++ 1.0"))
    assert kernel_build.record_onednn_build_failure(dnnl_spec, "error: boom")
    record = os.path.join(dnnl_spec.build_dir, "dnnl_failed.txt")
    assert kernel_build.recorded_onednn_failure(dnnl_spec) == "error: boom" and os.path.exists(record)
    monkeypatch.setenv("CXX", _fake_compiler(tmp_path, "fake-c++ 2.0"))
    assert kernel_build.recorded_onednn_failure(dnnl_spec) is None and not os.path.exists(record)
    assert kernel_build.kernel_build_spec(False).onednn is not None


def test_a_failure_record_without_a_key_is_stale(dnnl_spec):
    record = os.path.join(dnnl_spec.build_dir, "dnnl_failed.txt")
    with open(record, "w") as f:
        f.write("the build with oneDNN 3.2.0 failed: error: boom\n")  # what older versions wrote
    assert kernel_build.recorded_onednn_failure(dnnl_spec) is None and not os.path.exists(record)
