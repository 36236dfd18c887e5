"""Fixtures of the layer tests."""
import pytest

from basebn.ops import bn_ops, kernel_library


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
