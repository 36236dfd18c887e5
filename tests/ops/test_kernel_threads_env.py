"""$BASEBN_NUM_THREADS outside [1, MAX_THREADS] (or not a number) is OpenMP's default to every CPU op of the kernel
library, so a library user who never runs a CLI (the CLIs refuse it: tests/utils/test_env_vars.py) cannot start
100000 threads (a segmentation fault) or 20000 (minutes per batch)."""
import os
import subprocess
import sys

import pytest

from basebn.ops import kernel_library
from tests.support import ROOT

PROBE = """
import os, numpy as np, megengine as mge
from basebn.ops import bn_ops, matmul_ops
from basebn.layers.conv import conv2d
from basebn.layers.max_pool import max_pool2d
rng = np.random.default_rng(0)
x = rng.standard_normal((4, 8, 32, 32)).astype(np.float32)
a, b = rng.standard_normal((16, 24)).astype(np.float32), rng.standard_normal((24, 8)).astype(np.float32)
pooled = x.reshape(4, 8, 16, 2, 16, 2).max(axis=(3, 5))
for value in os.environ["THREAD_VALUES"].split(","):
    os.environ["BASEBN_NUM_THREADS"] = value  # read by the ops at every call
    y = conv2d(mge.tensor(np.ones((1, 2, 4, 4), np.float32)), mge.tensor(np.ones((3, 2, 3, 3), np.float32)),
               padding=1).numpy()
    assert y[0, 0, 1, 1] == 18.0 and y[0, 0, 0, 0] == 8.0, (value, y[0, 0])  # 2 channels x 9 (4 at a corner) ones
    np.testing.assert_array_equal(max_pool2d(mge.tensor(x), 2).numpy(), pooled)
    np.testing.assert_allclose(matmul_ops.matmul(mge.tensor(a), mge.tensor(b)).numpy(), a @ b, rtol=1e-5, atol=1e-5)
    with bn_ops.use_backend("kernel"):
        mean, m2 = (t.numpy() for t in bn_ops.bn_stats(mge.tensor(x)))
    np.testing.assert_allclose(mean, x.mean(axis=(0, 2, 3)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(m2, ((x - x.mean(axis=(0, 2, 3), keepdims=True)) ** 2).sum(axis=(0, 2, 3)), rtol=1e-4)
    print("OK", value, flush=True)
"""


def test_out_of_range_thread_counts_are_the_openmp_default_in_every_op():
    if not kernel_library.conv_kernel_available():
        pytest.skip(f"the oneDNN ops are not built here: {kernel_library.conv_kernel_error()}")
    values = ["100000", "1025", "0", "abc", "-3", "2"]
    env = dict(os.environ, PYTHONPATH=ROOT, THREAD_VALUES=",".join(values), BASEBN_CONV_BACKEND="dnnl",
               BASEBN_BN_BACKEND="kernel")
    res = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"exit {res.returncode}\n{res.stdout}\n{res.stderr[-3000:]}"
    assert [ln.split()[1] for ln in res.stdout.splitlines() if ln.startswith("OK")] == values
