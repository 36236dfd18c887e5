"""The self-check's failure path on CPU: a kernel library built from sources with a planted wrong constant.

The copy of basebn/ops/csrc multiplies every normalised value by 1.01 (bn_math.h, bn_normalize_elem); it
is built BN-only (no oneDNN) with $BASEBN_KERNEL_DIR and a fresh $BASEBN_KERNEL_CACHE, once per machine state and
kept between runs (tests/support/build_cache.py), and each module's processes load a copy of that cache
(MegEngine loads one custom-op library per process). The self-check must fail naming
bn_normalize, the fused BN-activation forwards built on the same per-element function, and the fused backwards
whose SiLU / HSwish cases recompute the pre-activation with it (NORMALIZE_OPS), and nothing else; training
must warn once and then train exactly as the pure-MegEngine BN ops do (CPU training is deterministic), and, with
BASEBN_SELFCHECK=0, differently (the planted error reaches training, so the check is what protects it).
"""
import json
import os
import pathlib
import shutil
import subprocess

import megengine as mge
import pytest
from megengine.core.ops.custom import get_custom_op_abi_tag
from megengine.utils import custom_op_tools as cot

from basebn.ops import kernel_build, kernel_library
from tests.support import ROOT
from tests.support.build_cache import build_key, cached_build, local_includes
from tests.support.cli import PY, metrics, run
from tests.support.mpi_launch import find_mpiexec

CORRECT = "return (x - mean) * scale + bias;"
PLANTED = "return (x - mean) * scale * 1.01f + bias;"
WARNING = "basebn self-check:"
BUILD = """
from basebn.ops import kernel_library
lib = kernel_library.load_kernels()
assert lib is not None and not lib["conv"], (lib, kernel_library.kernel_error())
"""
# the ops that compute bn_normalize_elem: the plain normalisation, the fused BN -> activation (-> add) forwards, and
# the fused backwards (reduce, elemt), whose SiLU / HSwish cases recompute the pre-activation with it
NORMALIZE_OPS = ["bn_normalize", "bn_act_normalize", "bn_add_act_normalize", "bn_act_backward_reduce",
                 "bn_act_backward_elemt", "bn_act_train_forward", "bn_act_train_backward"]


def _planted_env(root):
    """The environment of a process on the planted sources in ``root``/kernels and the kernel cache ``root``/cache."""
    env = dict(os.environ, PYTHONPATH=ROOT, BASEBN_KERNEL_DIR=str(root / "kernels"),
               BASEBN_KERNEL_CACHE=str(root / "cache"), BASEBN_ONEDNN_ROOT=str(root / "no-onednn"),
               BASEBN_KERNEL_CUDA="0")
    for var in ("BASEBN_BN_BACKEND", "BASEBN_CONV_BACKEND", "BASEBN_SELFCHECK"):
        env.pop(var, None)
    return env


def _build_planted(folder):
    """Plant the wrong constant in a copy of the sources in ``folder``/kernels and build the BN-only library from them
    into the kernel cache ``folder``/cache, in a subprocess; returns its exit status, its output and ``folder``."""
    root = pathlib.Path(folder)
    shutil.copytree(kernel_build.kernel_source_dir(), root / "kernels")
    math_h = root / "kernels" / "bn_math.h"
    text = math_h.read_text()
    assert text.count(CORRECT) == 1, "bn_math.h changed: update the planted constant"
    math_h.write_text(text.replace(CORRECT, PLANTED))
    r = subprocess.run([PY, "-c", BUILD], cwd=ROOT, env=_planted_env(root), capture_output=True, text=True, timeout=600)
    return r.returncode, r.stdout + r.stderr, str(root)


def _planted_build_key():
    """What the planted library depends on (tests/support/build_cache.py): the BN-only build's sources and the local
    headers they include, the planted replacement, the flags, MegEngine (version, ABI, build script), the compiler,
    ninja, and the Python code that drives the build and writes its record."""
    spec = kernel_build.kernel_build_spec(False, onednn=None)
    files = sorted(set(local_includes(spec.sources)) | set(spec.headers))
    code = [cot.__file__, kernel_build.__file__, kernel_library.__file__]
    return build_key(files + code, (os.environ.get("CXX", "c++"), "ninja"),
                     (CORRECT, PLANTED, spec.cflags, spec.ldflags, mge.__version__, str(get_custom_op_abi_tag())))


@pytest.fixture(scope="module")
def bad_env(tmp_path_factory):
    """Environment of a process that loads the planted library, and the first self-check's outcome on it.

    The library is built once per machine state (:func:`cached_build`, keyed by :func:`_planted_build_key`); each
    module gets its own copy of the sources and of the kernel cache (the self-check verdicts the tests write land
    there), and runs the first self-check itself."""
    status, output, folder = cached_build("selfcheck_planted", _planted_build_key(), _build_planted,
                                          keep=lambda result: result[0] == 0)
    assert status == 0, output
    built = pathlib.Path(folder)
    root = tmp_path_factory.mktemp("planted")
    shutil.copytree(built / "kernels", root / "kernels")
    shutil.copytree(built / "cache", root / "cache",
                    ignore=shutil.ignore_patterns("selfcheck-*", "build.flock", "lock"))
    env = _planted_env(root)
    r = run(["basebn.tools.selfcheck", "--quick", "--json"], env=env)
    env["FIRST_SELFCHECK"] = json.dumps([r.returncode, r.stdout, r.stderr])
    return env


def _rows(stdout):
    return {row["op"]: row for row in json.loads(stdout.strip().splitlines()[-1])["rows"]}


def test_selfcheck_fails_naming_the_wrong_op(bad_env):
    code, out, err = json.loads(bad_env["FIRST_SELFCHECK"])
    assert code == 1, out + err
    rows = _rows(out)
    assert [op for op, row in rows.items() if row["verdict"] == "FAIL"] == NORMALIZE_OPS
    assert 5e-3 < rows["bn_normalize"]["max_rel"] < 2e-2  # the planted 1% (of the largest |y|)
    assert {rows[op]["verdict"] for op in ("bn_stats", "bn_backward_reduce", "bn_backward_elemt")} == {"ok"}
    r = run(["basebn.tools.selfcheck", "--quick"], env=bad_env)  # the table names it too
    assert r.returncode == 1
    assert [ln.split()[0] for ln in r.stdout.splitlines() if "FAIL" in ln] == NORMALIZE_OPS


def test_training_falls_back_with_one_warning_and_trains_as_megengine(bad_env, tiny, tmp_path):
    ref_env = dict(bad_env, BASEBN_BN_BACKEND="fallback", BASEBN_CONV_BACKEND="megengine", BASEBN_SELFCHECK="0")
    ref = run(["basebn.train", tiny, f"output_dir={tmp_path / 'ref'}"], env=ref_env)
    assert ref.returncode == 0, ref.stderr
    for attempt in ("checked", "cached"):  # the second run reads the verdict cached by the first
        r = run(["basebn.train", tiny, f"output_dir={tmp_path / attempt}"], env=bad_env)
        assert r.returncode == 0, r.stderr
        log = r.stdout + r.stderr
        assert log.count(WARNING) == 1, log[-3000:]
        line = next(ln for ln in log.splitlines() if WARNING in ln)
        assert "bn_normalize" in line and "BASEBN_BN_BACKEND=fallback" in line and "report" in line
        assert metrics(str(tmp_path / attempt)) == metrics(str(tmp_path / "ref"))
    cached = [f for d in os.listdir(bad_env["BASEBN_KERNEL_CACHE"])
              for f in os.listdir(os.path.join(bad_env["BASEBN_KERNEL_CACHE"], d)) if f.startswith("selfcheck-")]
    assert len(cached) == 1, cached


def test_without_the_check_the_wrong_kernel_reaches_training(bad_env, tiny, tmp_path):
    ref_env = dict(bad_env, BASEBN_BN_BACKEND="fallback", BASEBN_CONV_BACKEND="megengine", BASEBN_SELFCHECK="0")
    ref = run(["basebn.train", tiny, f"output_dir={tmp_path / 'ref'}", "solver.max_epoch=1"], env=ref_env)
    off = run(["basebn.train", tiny, f"output_dir={tmp_path / 'off'}", "solver.max_epoch=1"],
              env=dict(bad_env, BASEBN_SELFCHECK="0"))
    assert ref.returncode == 0 and off.returncode == 0, ref.stderr + off.stderr
    assert WARNING not in off.stdout + off.stderr
    assert metrics(str(tmp_path / "off")) != metrics(str(tmp_path / "ref"))


@pytest.mark.mpi
def test_two_process_selfcheck_fails_sync_bn_too(bad_env):
    """Under mpiexec both ranks check their device and SyncBatchNorm; the planted error shows in both."""
    env = {k: v for k, v in bad_env.items() if not k.startswith(("PMI_", "PMIX_", "OMPI_", "MPI_LOCAL", "HYDRA_"))}
    cmd = [find_mpiexec(), "-n", "2", PY, "-m", "basebn.tools.selfcheck", "--quick", "--json"]
    r = subprocess.run(cmd, cwd=ROOT, env=dict(env, OMP_NUM_THREADS="1"), stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    report = json.loads(r.stdout.strip().splitlines()[-1])
    assert report["world_size"] == 2
    assert {row["op"] for row in report["rows"] if row["verdict"] == "FAIL"} == {*NORMALIZE_OPS, "sync_bn"}
    assert [row["op"] for row in report["failed_on_other_ranks"]] == NORMALIZE_OPS
