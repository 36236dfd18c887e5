"""python -m basebn.tools.selfcheck on the real kernel library, and the automatic check's cache and switch.

The failure path with a really wrong kernel is tests/integration/test_selfcheck_fallback.py.
"""
import json
import os
import subprocess
import sys

import pytest
from loguru import logger

from basebn.ops import bn_ops, kernel_autocheck, kernel_library, kernel_selfcheck
from basebn.tools import selfcheck
from tests.support import ROOT

pytestmark = pytest.mark.skipif(not kernel_library.kernel_available(),
                                reason=f"BN kernels unavailable: {kernel_library.kernel_error()}")


def _selfcheck(*args, **env):
    env = dict(os.environ, PYTHONPATH=ROOT, **env)
    return subprocess.run([sys.executable, "-m", "basebn.tools.selfcheck", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def test_quick_selfcheck_passes_on_the_real_library():
    r = _selfcheck("--quick", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(r.stdout.strip().splitlines()[-1])
    rows = {row["op"]: row for row in report["rows"]}
    for op in kernel_selfcheck.BN_OPS + kernel_selfcheck.BN_ACT_OPS:  # every BN op ran cases on this CPU and agreed
        assert rows[op]["verdict"] == "ok" and rows[op]["cases"] >= 4, rows[op]
        assert rows[op]["max_rel"] <= rows[op]["tol"]
    conv = "ok" if kernel_library.conv_kernel_available() else "skip"
    assert [rows[op]["verdict"] for op in kernel_selfcheck.CONV_OPS] == [conv] * 3
    assert [rows[op]["verdict"] for op in kernel_selfcheck.POOL_OPS] == [conv] * 2  # built with the conv ops
    assert rows["matmul"]["verdict"] == conv and rows["matmul"]["cases"] == (4 if conv == "ok" else 0), rows["matmul"]
    assert rows["sync_bn"]["verdict"] == "skip"  # one process


def test_table_has_one_row_per_op():
    r = _selfcheck("--quick")
    assert r.returncode == 0, r.stdout + r.stderr
    ops = [ln.split()[0] for ln in r.stdout.splitlines()[2:]]
    assert ops == list(kernel_selfcheck.BN_OPS + kernel_selfcheck.BN_ACT_OPS + kernel_selfcheck.RUNNING_OPS
                       + kernel_selfcheck.CONV_OPS + kernel_selfcheck.POOL_OPS + kernel_selfcheck.MATMUL_OPS
                       + selfcheck.SYNC_BN_OPS)


def test_unbuildable_library_is_a_one_line_error(tmp_path):
    (tmp_path / "empty").mkdir()  # a folder without the sources (a missing one is refused up front, as a bad variable)
    r = _selfcheck("--quick", BASEBN_KERNEL_DIR=str(tmp_path / "empty"), BASEBN_KERNEL_CACHE=str(tmp_path / "c"))
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: the basebn kernel library did not build"), r.stderr


# ------------------------------------------------------------------------- the automatic check
@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """The automatic check with an empty cache in tmp_path; backend variables restored afterwards."""
    lib = dict(kernel_library.kernel_library(), build_dir=str(tmp_path))
    monkeypatch.setattr(kernel_autocheck, "load_kernels", lambda: lib)
    monkeypatch.setattr(kernel_autocheck, "_checked", {})
    for var in ("BASEBN_BN_BACKEND", "BASEBN_CONV_BACKEND"):
        monkeypatch.setenv(var, "auto")
    monkeypatch.delenv("BASEBN_SELFCHECK", raising=False)
    warnings = []
    sink = logger.add(lambda m: warnings.append(str(m)), level="WARNING")
    yield tmp_path, warnings
    logger.remove(sink)


def _path(build_dir):
    return kernel_autocheck.selfcheck_cache_path(str(build_dir), kernel_selfcheck.device_name())


def test_first_use_checks_then_the_cache_answers(fresh, monkeypatch):
    build_dir, warnings = fresh
    got = kernel_autocheck.ensure_kernels_checked()
    families = ["bn"] + (["conv"] if kernel_library.conv_kernel_available() else [])
    assert sorted(got) == families and all(v["ok"] for v in got.values())
    assert json.load(open(_path(build_dir)))["families"] == got
    monkeypatch.setattr(kernel_autocheck, "_checked", {})  # a new process: only the file is left

    def no_check(**kwargs):
        raise AssertionError("the cached verdict should have been used")

    monkeypatch.setattr(kernel_autocheck, "run_selfcheck", no_check)
    assert kernel_autocheck.ensure_kernels_checked() == got
    assert os.environ["BASEBN_BN_BACKEND"] == "auto" and warnings == []


def test_a_failed_verdict_switches_the_family_off_with_one_warning(fresh):
    build_dir, warnings = fresh
    failed = {"ok": False, "failed": ["bn_normalize: max rel err 1.00e-02 > 1e-04"]}
    with open(_path(build_dir), "w") as f:
        json.dump({"format": kernel_autocheck._FORMAT,
                   "families": {"bn": failed, "conv": {"ok": True, "failed": []}}}, f)
    assert kernel_autocheck.ensure_kernels_checked()["bn"] == failed
    assert os.environ["BASEBN_BN_BACKEND"] == "fallback" and os.environ["BASEBN_CONV_BACKEND"] == "auto"
    assert bn_ops.backend() == "fallback"
    kernel_autocheck.ensure_kernels_checked()  # a second model built in the run: no second warning
    assert len(warnings) == 1 and "bn_normalize" in warnings[0] and "BASEBN_SELFCHECK=0" in warnings[0]


def test_selfcheck_off_checks_nothing(fresh, monkeypatch):
    build_dir, _ = fresh
    monkeypatch.setenv("BASEBN_SELFCHECK", "0")
    monkeypatch.setattr(kernel_autocheck, "run_selfcheck", None)
    assert kernel_autocheck.ensure_kernels_checked() == {}
    assert not os.path.exists(_path(build_dir))


def test_sync_shards_are_uneven_or_leave_a_rank_empty():
    for world in (2, 3, 5):
        uneven = selfcheck._shards(4 * world + 1, world, empty_rank=False)
        assert sum(uneven) == 4 * world + 1 and min(uneven) >= 1 and len(set(uneven)) > 1
        empty = selfcheck._shards(4 * world, world, empty_rank=True)
        assert sum(empty) == 4 * world and empty[-1] == 0 and min(empty[:-1]) >= 1


def test_devices_without_a_gpu_is_a_one_line_error():
    if kernel_selfcheck.device_is_gpu():
        pytest.skip("a GPU is here")
    r = _selfcheck("--devices", "2")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "error: --devices needs GPUs; on CPU run: mpiexec -n N python -m basebn.tools.selfcheck"]
