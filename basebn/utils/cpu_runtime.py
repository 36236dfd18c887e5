"""Process settings that make MegEngine's CPU training step use the cores for work: :func:`tune_cpu_runtime`.

Two costs it removes, measured on a ResNet-20 step (docs/figures.md, "CPU runtime settings"):
  * MegEngine's queue consumers (the ``cpu0:0`` dispatcher and the imperative ``worker``) busy-wait before they
    sleep, for as many spins as take ~5 ms (calibrated at start-up). A step issues a command every few hundred
    microseconds, so the idle dispatcher never sleeps: it burnt ~250 ms of a core per 450 ms step, the core a
    second kernel thread needs. ``MGB_WORKER_MAX_SPIN`` (MegEngine's own variable, read once, at the first
    queued command) caps the spin.
  * glibc hands freed blocks above its mmap threshold back to the kernel and trims the heap top, so every step
    page-faults its activations in again (~10-15 thousand faults, ~50-100 ms of system time per step).
    ``mallopt`` keeps blocks up to 32 MiB on the heap and the freed heap mapped; the peak is unchanged.
"""
import ctypes
import os

__all__ = ["WORKER_MAX_SPIN", "tune_cpu_runtime"]

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
