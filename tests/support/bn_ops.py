"""Test-only controls of the BN kernels (basebn.ops.bn_ops, basebn.ops.kernel_library): the two knobs
tests need that users never do.

This module is the one place that touches their private state. :func:`backend` is the fixture of the op and layer
tests (tests/ops/conftest.py and tests/layers/conftest.py import it).
"""
import contextlib

import pytest

from basebn.ops import bn_ops, kernel_library
from basebn.ops.bn_ops import kernel


@pytest.fixture(params=["kernel", "fallback"])
def backend(request):
    """Run the test on each BN path: the compiled kernels (skipped, with the build error, where they cannot be
    built) and the pure-MegEngine fallback."""
    name = request.param
    if name == "kernel" and not kernel_library.kernel_available():
        pytest.skip(f"BN kernels unavailable: {kernel_library.kernel_error()}")
    with bn_ops.use_backend(name):
        assert bn_ops.backend() == name
        yield name


@contextlib.contextmanager
def forced_strided_kernels(enabled=True):
    """Make the CPU kernels take their non-contiguous (gather) path on every input."""
    prev = kernel._force_strided
    kernel._force_strided = bool(enabled)
    try:
        yield
    finally:
        kernel._force_strided = prev


@contextlib.contextmanager
def failed_kernel_build(error):
    """Pretend this process's kernel build failed with ``error`` (nothing is built or unloaded)."""
    prev = kernel_library._state
    kernel_library._state = kernel_library._LoadState(tried=True, error=error)
    try:
        yield
    finally:
        kernel_library._state = prev
