"""benchmarks/cuda (the standalone CUDA harness) where no GPU is: its merge math, its skip path, its ctypes API.

The GPU part runs only on a GPU machine (python benchmarks/cuda/run_harness.py); here: the SyncBN merge the
harness mirrors equals basebn's own (bn_function's packing, moments' merge) and the whole batch's numpy
statistics; without PyTorch the harness compiles only and exits 0 with the reason; the library it builds
exports the C API, and a call with bad arguments returns cudaErrorInvalidValue without touching a GPU. The library
is built once per run (``harness_build_dir``), and kept between runs while the sources, the headers they include,
the harness's build code, nvcc and its host compiler are the same (tests/support/build_cache.py); the harness run
finds it in its build folder.
"""
import ctypes
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import megengine as mge

from basebn.layers import bn_function
from basebn.layers.moments import merge_all
from tests.support import ROOT
from tests.support.build_cache import build_key, cached_build, local_includes
from tests.support.shared_build import build_once

HARNESS_DIR = os.path.join(ROOT, "benchmarks", "cuda")


def _load(name):
    spec = importlib.util.spec_from_file_location(f"cuda_harness_{name}", os.path.join(HARNESS_DIR, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


shard_merge = _load("shard_merge")
bn_cuda_lib = _load("bn_cuda_lib")
NVCC = bn_cuda_lib.find_nvcc()
ARCHS = ["80"]  # one architecture keeps the build short


@pytest.fixture(scope="session")
def harness_build_dir(tmp_path_factory):
    """The harness's build folder, holding its library for ARCHS, built by its own build_library
    (run_harness.py --build-dir reuses it: the name is keyed by the sources and flags), once for this run and kept
    between runs under a key of everything it is built from (the checkout's path too: the flags name it); None
    without nvcc."""
    if NVCC is None:
        return None
    sources = local_includes([os.path.join(bn_cuda_lib.KERNEL_DIR, "bn_cuda_launch.cu")])
    key = build_key(sources + [bn_cuda_lib.__file__], (NVCC, "gcc", "g++"), (ARCHS, bn_cuda_lib.KERNEL_DIR))
    return build_once(tmp_path_factory, "cuda_harness", lambda _: cached_build(
        "cuda_harness", key, lambda folder: (bn_cuda_lib.build_library(NVCC, ARCHS, folder), folder)))


def test_packed_rows_are_bn_functions():
    rng = np.random.default_rng(0)
    for count in (0, 1, 37, (1 << 20) - 1, 1 << 20, 3 * (1 << 20) + 5, (1 << 40) + 12345):
        mean = rng.standard_normal(5).astype(np.float32)
        m2 = rng.random(5).astype(np.float32) * 100
        ours = shard_merge.pack_row(count, mean, m2)
        theirs = bn_function._pack(count, mge.tensor(mean), mge.tensor(m2), None).numpy()
        np.testing.assert_array_equal(ours, theirs)
        back = shard_merge.merge_rows(ours[None], 5)
        assert back.count == count


def test_merged_shards_give_the_whole_batch_statistics():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((23, 4, 3)) * 2.0 + 5.0
    sizes = [6, 0, 1, 9, 7]  # uneven, one empty rank
    rows = []
    for lo, hi in shard_merge.shard_bounds(sizes):
        part = x[lo:hi]
        count = part.shape[0] * part.shape[2]
        mean = part.mean(axis=(0, 2)) if count else np.zeros(4)
        m2 = ((part - mean[None, :, None]) ** 2).sum(axis=(0, 2)) if count else np.zeros(4)
        rows.append(shard_merge.pack_row(count, mean, m2))
    batch = shard_merge.merge_rows(np.stack(rows), 4)
    assert batch.count == 23 * 3
    np.testing.assert_allclose(batch.mean, x.mean(axis=(0, 2)), rtol=1e-6)
    np.testing.assert_allclose(batch.m2 / batch.count, x.var(axis=(0, 2)), rtol=1e-5)
    # and what basebn merges from the same rows
    mine = merge_all(bn_function._unpack(np.stack(rows), 4), 4)
    np.testing.assert_array_equal(mine.mean, batch.mean)
    np.testing.assert_array_equal(mine.m2, batch.m2)


def test_all_reduce_sum_is_the_float32_sum():
    parts = [np.array([1.0, 2.0], np.float32), np.array([0.5, -1.0], np.float32), np.zeros(2, np.float32)]
    out = shard_merge.all_reduce_sum(parts)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [1.5, 1.0])


def test_harness_without_torch_or_gpu_compiles_only_and_exits_0(tmp_path, harness_build_dir):
    if importlib.util.find_spec("torch") is not None:
        pytest.skip("PyTorch is installed here: the skip path is not what runs")
    out = tmp_path / "result.json"
    build_dir = harness_build_dir[1] if harness_build_dir else str(tmp_path / "build")
    r = subprocess.run([sys.executable, os.path.join(HARNESS_DIR, "run_harness.py"), *(f"--arch={a}" for a in ARCHS),
                        "--build-dir", build_dir, "--json", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "skip:" in r.stdout
    result = json.load(open(out))
    if NVCC is None:
        assert "nvcc not found" in result["skipped"] and result["compile"] is None
    else:
        assert result["compile"]["ok"] and os.path.exists(result["compile"]["library"])
        assert result["compile"]["library"] == harness_build_dir[0]  # the flags and sources of the build checked
        assert "PyTorch is not installed" in result["skipped"] and result["checks"] == []


@pytest.mark.skipif(NVCC is None, reason="nvcc not found: the standalone library cannot be built")
def test_c_api_rejects_bad_arguments_without_a_gpu(harness_build_dir):
    so = harness_build_dir[0]
    lib = bn_cuda_lib.declare_api(ctypes.CDLL(so))
    invalid = 1  # cudaErrorInvalidValue
    bad_ndim = bn_cuda_lib.bn_tensor(0x1000, bn_cuda_lib.FLOAT32, (7,), (1,))
    mean = ctypes.c_void_p(0x2000)
    assert lib.basebn_bn_cuda_stats(ctypes.byref(bad_ndim), mean, mean, 0, None) == invalid
    bad_dtype = bn_cuda_lib.bn_tensor(0x1000, 7, (2, 3), (3, 1))
    assert lib.basebn_bn_cuda_normalize(ctypes.byref(bad_dtype), mean, mean, None, None, mean, 0, None) == invalid
    x = bn_cuda_lib.bn_tensor(0x1000, bn_cuda_lib.FLOAT32, (2, 3, 4), (12, 4, 1))
    dy = bn_cuda_lib.bn_tensor(0x1000, bn_cuda_lib.FLOAT32, (2, 3, 5), (15, 5, 1))
    assert lib.basebn_bn_cuda_backward_reduce(ctypes.byref(dy), ctypes.byref(x), mean, mean, mean, mean, 0,
                                              None) == invalid
    dy16 = bn_cuda_lib.bn_tensor(0x1000, bn_cuda_lib.FLOAT16, (2, 3, 4), (12, 4, 1))
    assert lib.basebn_bn_cuda_backward_elemt(ctypes.byref(dy16), ctypes.byref(x), mean, mean, None, mean, mean, 24.0,
                                             mean, 0, None) == invalid
    assert lib.basebn_bn_cuda_normalize(ctypes.byref(x), None, mean, None, None, mean, 0, None) == invalid
    # the fused passes: an unknown activation code, a shortcut of another shape, ReLU's backward without y
    assert lib.basebn_bn_cuda_act_normalize(ctypes.byref(x), None, mean, mean, None, None, 9, mean, 0,
                                            None) == invalid
    assert lib.basebn_bn_cuda_act_normalize(ctypes.byref(x), ctypes.byref(dy), mean, mean, None, None,
                                            bn_cuda_lib.ACT_CODES["relu"], mean, 0, None) == invalid
    assert lib.basebn_bn_cuda_act_backward_reduce(ctypes.byref(x), None, ctypes.byref(x), mean, mean, None, None,
                                                  bn_cuda_lib.ACT_CODES["relu"], mean, mean, 0, None) == invalid
    # an empty input launches nothing and needs no GPU
    empty = bn_cuda_lib.bn_tensor(0, bn_cuda_lib.FLOAT32, (0, 3, 4), (12, 4, 1))
    assert lib.basebn_bn_cuda_normalize(ctypes.byref(empty), mean, mean, None, None, mean, 0, None) == 0
