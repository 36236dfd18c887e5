"""Process settings that make MegEngine's CPU training step use the cores for work: :func:`tune_cpu_runtime`
(every CLI) and :func:`use_inline_cpu_device` (basebn.train).

Three costs they remove, measured on a training step (docs/figures.md, "CPU runtime settings"):
  * On MegEngine's ``cpu0`` device its kernels run on a dispatcher thread, and a custom op (basebn's BN, conv
    and pool ops, run by the imperative worker) must first wait for that thread's queue: a hand-shake of
    ~250 us per call (perf: ``SCQueueSynchronizer::producer_wait``), ~150 calls per ResNet-20 step.
    :func:`use_inline_cpu_device` makes ``cpu:default`` the default device (MegEngine's CPU device that runs
    its kernels on the calling thread, the worker): the queue is always empty, a custom op costs ~35 us
    (bench_op_overhead.py). Not for a process that dumps a traced graph: MegEngine's dump then fails
    (``cn == cur``), so export, evaluation CLIs and traced training steps stay on cpu0.
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
