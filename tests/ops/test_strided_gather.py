"""basebn/ops/csrc/strided_rows.h (the kernels' gather of a non-contiguous input) against numpy's own strided views
(np.lib.stride_tricks.as_strided copied out): transposes, broadcasts (stride 0), size-1 and merged dimensions, a
5-D permutation and two views of ~100 K values. MegEngine 1.13 hands the ops contiguous tensors in the test suite, so
the gather is driven directly, through tests/support/gather_harness.cpp."""
import os
import shutil
import subprocess

import numpy as np
import pytest

from tests.support import ROOT

# (base array shape, view shape, view strides in elements)
CASES = {
    "nchw_from_cnhw": ((3, 4, 5, 6), (4, 3, 5, 6), (30, 120, 6, 1)),
    "hw_transposed": ((2, 3, 4, 5), (2, 3, 5, 4), (60, 20, 1, 5)),
    "spatial_broadcast": ((4, 6, 1, 1), (4, 6, 7, 7), (6, 1, 0, 0)),
    "batch_broadcast": ((1, 5, 3, 3), (4, 5, 3, 3), (0, 9, 3, 1)),
    "size_one_dims": ((3, 1, 4, 1), (1, 4, 3, 1), (1, 1, 4, 1)),
    "contiguous": ((2, 3, 4), (2, 3, 4), (12, 4, 1)),
    "every_other_column": ((3, 10), (3, 5), (10, 2)),
    "five_dims_permuted": ((2, 3, 4, 5, 6), (6, 2, 5, 3, 4), (1, 360, 6, 120, 30)),
    "single_value": ((1,), (1, 1, 1), (1, 1, 1)),
    "large_transposed": ((12, 8, 33, 31), (8, 12, 33, 31), (1023, 8184, 31, 1)),  # 98 208 values
    "large_broadcast": ((32, 64, 1, 1), (32, 64, 9, 9), (64, 1, 0, 0)),  # 165 888 values
}


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    if shutil.which("g++") is None:
        pytest.skip("no g++")
    exe = tmp_path_factory.mktemp("gather") / "gather_harness"
    source = os.path.join(ROOT, "tests", "support", "gather_harness.cpp")
    subprocess.run(["g++", "-O2", "-std=c++14", "-Wall", "-Werror", "-I",
                    os.path.join(ROOT, "basebn", "ops", "csrc"), source, "-o", str(exe)], check=True)
    return exe


@pytest.mark.parametrize("name", sorted(CASES))
def test_gather_matches_numpy_strided_view(harness, tmp_path, name):
    base_shape, shape, strides = CASES[name]
    base = np.arange(np.prod(base_shape), dtype=np.float32).reshape(base_shape) * 0.5 - 7
    want = np.lib.stride_tricks.as_strided(base, shape, [s * 4 for s in strides]).copy()
    base.tofile(tmp_path / "src.f32")
    subprocess.run([str(harness), str(tmp_path / "src.f32"), str(tmp_path / "out.f32"), str(want.size), str(len(shape)),
                    *map(str, shape), *map(str, strides)], check=True, timeout=60)
    got = np.fromfile(tmp_path / "out.f32", np.float32).reshape(shape)
    np.testing.assert_array_equal(got, want)
