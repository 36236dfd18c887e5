"""Process settings that let MegEngine's CPU training step spend the cores on work: :func:`tune_cpu_runtime`
(every CLI: capped worker spin, freed memory kept mapped) and :func:`use_inline_cpu_device` (basebn.train: no
dispatcher queue for basebn's custom ops to wait for). What each removes, measured: docs/figures.md, "CPU
runtime settings".
"""
import ctypes
import os

from megengine.core._imperative_rt.common import CompNode

__all__ = ["WORKER_MAX_SPIN", "INLINE_CPU_DEVICE", "tune_cpu_runtime", "use_inline_cpu_device"]

INLINE_CPU_DEVICE = "cpu:default"  # (megengine.set_default_device's name check refuses it; CompNode takes it)

WORKER_MAX_SPIN = 30000  # ~10-30 us of spinning; 0 (sleep at once) and 300000 measured alike within noise
_MMAP_THRESHOLD = 32 << 20  # glibc's largest allowed value (DEFAULT_MMAP_THRESHOLD_MAX, 64-bit)
_TRIM_THRESHOLD = 1 << 30
_TOP_PAD = 64 << 20
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3  # <malloc.h>


def tune_cpu_runtime():
    """Cap MegEngine's worker spin (unless ``MGB_WORKER_MAX_SPIN`` is set already) and keep freed memory in
    the process (glibc only; elsewhere nothing changes). Call before MegEngine's first operation: the spin
    is read once. Returns ``{"worker_max_spin": str, "malloc": bool}``, what took effect."""
    os.environ.setdefault("MGB_WORKER_MAX_SPIN", str(WORKER_MAX_SPIN))
    libc = ctypes.CDLL(None)
    malloc = hasattr(libc, "mallopt") and hasattr(libc, "gnu_get_libc_version")
    if malloc:
        malloc = all(libc.mallopt(option, value) == 1 for option, value in (
            (_M_MMAP_THRESHOLD, _MMAP_THRESHOLD), (_M_TRIM_THRESHOLD, _TRIM_THRESHOLD), (_M_TOP_PAD, _TOP_PAD)))
    return {"worker_max_spin": os.environ["MGB_WORKER_MAX_SPIN"], "malloc": malloc}


def use_inline_cpu_device():
    """Make :data:`INLINE_CPU_DEVICE` MegEngine's default device: its CPU kernels run on the thread that issues
    them, so basebn's custom ops wait for no queue. Call on a machine without CUDA before the first tensor that
    should live there (tensors made before keep their device; an op mixing the two fails), and not in a process
    that dumps a traced graph. Returns the default device now."""
    CompNode._set_default_device(INLINE_CPU_DEVICE)
    return CompNode._get_default_device()
