"""Test-only controls of the BN kernels (basebn.ops.bn_ops, basebn.ops.kernel_library): the two knobs
tests need that users never do.

This module is the one place that touches their private state.
"""
import contextlib

from basebn.ops import kernel_library
from basebn.ops.bn_ops import kernel


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
