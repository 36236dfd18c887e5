"""Which path the BN ops take: ``"kernel"`` or ``"fallback"``.

``$BASEBN_BN_BACKEND=kernel|fallback|auto`` (default ``auto``: the kernels when they load, else the
fallback after one warning); :func:`use_backend` overrides it for the current thread.
"""
import contextlib
import os
import threading
from typing import Iterator

from ...utils.env_vars import BN_BACKENDS
from ..kernel_library import KernelUnavailableError, kernel_error, load_kernels

__all__ = ["BACKENDS", "requested_backend", "use_backend", "backend"]

_ENV_BACKEND = "BASEBN_BN_BACKEND"
BACKENDS = BN_BACKENDS  # ("kernel", "fallback", "auto"), the CLIs check the variable against it
_override = threading.local()


def requested_backend():
    """The backend asked for: the :func:`use_backend` override, else ``$BASEBN_BN_BACKEND``, else ``"auto"``."""
    req = getattr(_override, "value", None)
    if req is None:
        req = os.environ.get(_ENV_BACKEND, "auto").strip().lower() or "auto"
    if req not in BACKENDS:
        raise ValueError(f"{_ENV_BACKEND} must be one of {BACKENDS}, got {req!r}")
    return req


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Temporarily force ``"kernel"``, ``"fallback"`` or ``"auto"`` (this thread only).

    Args:
        name: ``"kernel"``, ``"fallback"`` or ``"auto"``.

    Returns:
        A context manager.

    Raises:
        ValueError: another name.
    """
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {name!r}")
    prev = getattr(_override, "value", None)
    _override.value = name
    try:
        yield
    finally:
        _override.value = prev


def backend():
    """The path the ops take now: ``"kernel"`` or ``"fallback"``.

    Raises :class:`KernelUnavailableError` when ``kernel`` is forced and the kernels cannot load.
    """
    req = requested_backend()
    if req == "fallback":
        return "fallback"
    if load_kernels(warn=(req == "auto")) is not None:
        return "kernel"
    if req == "kernel":
        raise KernelUnavailableError(
            f"basebn BN kernels were requested ({_ENV_BACKEND}=kernel or use_backend('kernel')) "
            f"but could not be built/loaded: {kernel_error()}")
    return "fallback"
