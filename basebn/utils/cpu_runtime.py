"""Process settings that let MegEngine's CPU training step spend the cores on work: :func:`tune_cpu_runtime`
(capped worker spin, freed memory kept mapped), :func:`lower_event_poller_priority` (MegEngine's 10-microsecond
event poller yields to the compute threads), both applied by :func:`prepare_process` (``import basebn``, and every
CLI through :func:`quiet_device_probe`; ``BASEBN_TUNE_CPU=0`` leaves them out), and :func:`use_inline_cpu_device`
(basebn.train and ``basebn.setup_cpu_training()``: no dispatcher queue for basebn's custom ops to wait for; the
OpenMP threads spin briefly between ops). What each removes, measured: docs/figures.md, "CPU runtime settings";
what a library user gets: docs/library.md.
"""
import contextlib
import ctypes
import os
import sys
import time
import warnings

import megengine as mge
from megengine.core._imperative_rt.common import CompNode

__all__ = ["WORKER_MAX_SPIN", "INLINE_CPU_DEVICE", "INLINE_OMP_SPIN", "EVENT_POLLER_THREAD", "EVENT_POLLER_NICE",
           "TUNE_SWITCH", "tune_cpu_runtime", "lower_event_poller_priority", "use_inline_cpu_device", "tuning_wanted",
           "megengine_has_run", "quiet_device_probe", "prepare_process"]

TUNE_SWITCH = "BASEBN_TUNE_CPU"  # 0: basebn leaves MegEngine's and glibc's process settings as they are

INLINE_CPU_DEVICE = "cpu:default"  # (megengine.set_default_device's name check refuses it; CompNode takes it)
# libgomp's GOMP_SPINCOUNT with the inline device: an OpenMP worker spins this many pause-loop rounds for the next
# op's parallel region before it sleeps, instead of sleeping at once (PASSIVE, kernel_library's default) and making
# each region wait for its wake-up. Only where MegEngine's kernels run on the OpenMP master thread itself: on cpu0
# its dispatcher thread needs the core the worker would spin on. benchmarks/bench_train_step.py measures the rule
# (runners basebn, basebn-passive, basebn-cpu0)
INLINE_OMP_SPIN = 30000

WORKER_MAX_SPIN = 30000  # ~10-30 us of spinning; 0 (sleep at once) and 300000 measured alike within noise
_MMAP_THRESHOLD = 32 << 20  # glibc's largest allowed value (DEFAULT_MMAP_THRESHOLD_MAX, 64-bit)
_TRIM_THRESHOLD = 1 << 30
_TOP_PAD = 64 << 20
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD, _M_MMAP_MAX = -1, -2, -3, -4  # <malloc.h>
# glibc maps a block of at least the mmap threshold (at most 32 MiB) on its own and unmaps it when freed, so such
# a tensor is faulted in again, 4 KiB at a time, every time it is allocated: MobileNetV2's 32x96x56x56 activation
# (38.5 MB) every step, 28 of the 38 ms of the BN op that writes it here. With M_MMAP_MAX 0 every block comes from
# the heap and is reused. glibc's own MALLOC_MMAP_MAX_ or glibc.malloc.mmap_max tunable, when set, wins.

# MegEngine's imperative event poller (CompNodeSyncManager::monitor_events, imperative/src/impl/physical_tensor.cpp):
# from the first tensor on it wakes every 10 microseconds for the life of the process (~9 500 futex calls a
# second, ~10% of a core here), and each wake can take a core from an OpenMP thread mid-kernel
EVENT_POLLER_THREAD = "CompNodeSync"
EVENT_POLLER_NICE = 19  # the lowest priority: it runs when a core is free or after the compute threads' share
_TASKS = "/proc/self/task"
POLLER_START_WAIT_S = 0.5  # how long the probe waits for the poller thread to take its name (a loaded machine)


def tune_cpu_runtime():
    """Cap MegEngine's worker spin (unless ``MGB_WORKER_MAX_SPIN`` is set already) and keep freed memory in
    the process, large blocks too (glibc only; elsewhere nothing changes; a ``MALLOC_MMAP_MAX_`` or
    ``glibc.malloc.mmap_max`` in ``GLIBC_TUNABLES`` set by the user keeps its rule for large blocks). Call before
    MegEngine's first operation: the spin is read once. Returns ``{"worker_max_spin": str, "malloc": bool,
    "large_blocks_in_heap": bool}``, what took effect."""
    os.environ.setdefault("MGB_WORKER_MAX_SPIN", str(WORKER_MAX_SPIN))
    libc = ctypes.CDLL(None)
    malloc = hasattr(libc, "mallopt") and hasattr(libc, "gnu_get_libc_version")
    large_in_heap = False
    if malloc:
        malloc = all(libc.mallopt(option, value) == 1 for option, value in (
            (_M_MMAP_THRESHOLD, _MMAP_THRESHOLD), (_M_TRIM_THRESHOLD, _TRIM_THRESHOLD), (_M_TOP_PAD, _TOP_PAD)))
        tunables = os.environ.get("GLIBC_TUNABLES", "")
        user_rule = "MALLOC_MMAP_MAX_" in os.environ or "glibc.malloc.mmap_max" in tunables
        if malloc and not user_rule:
            large_in_heap = libc.mallopt(_M_MMAP_MAX, 0) == 1
    return {"worker_max_spin": os.environ["MGB_WORKER_MAX_SPIN"], "malloc": malloc,
            "large_blocks_in_heap": large_in_heap}


def lower_event_poller_priority(tasks_dir=_TASKS):
    """Give MegEngine's event-polling thread (:data:`EVENT_POLLER_THREAD`) nice :data:`EVENT_POLLER_NICE`, so its
    wakes every 10 microseconds stop pre-empting the compute threads (2 threads on 2 cores: ResNet-20 and
    ResNet-18 steps 15-20% faster, docs/figures.md). Linux only (thread ids under ``tasks_dir``); call after
    MegEngine's first tensor, which starts the thread. Only for CPU work: on GPU its polling releases device
    memory. Returns the thread ids changed (empty where there is no such thread or no /proc)."""
    changed = []
    for tid, name in _threads(tasks_dir):
        if name != EVENT_POLLER_THREAD:
            continue
        try:
            os.setpriority(os.PRIO_PROCESS, tid, EVENT_POLLER_NICE)  # (Linux: a thread id names one thread)
        except OSError:  # the thread ended, or the OS refused: nothing else depends on it
            continue
        changed.append(tid)
    return changed


def use_inline_cpu_device(omp_spin=False):
    """Make :data:`INLINE_CPU_DEVICE` MegEngine's default device: its CPU kernels run on the thread that issues
    them, so basebn's custom ops wait for no queue. Call on a machine without CUDA before the first tensor that
    should live there (tensors made before keep their device; an op mixing the two fails), and not in a process
    that dumps a traced graph. With ``omp_spin`` (the process has the cores to itself: not one of several MPI
    ranks, whose spinning workers would take each other's cores) also sets ``GOMP_SPINCOUNT`` to
    :data:`INLINE_OMP_SPIN` unless the user set it or ``OMP_WAIT_POLICY``: libgomp reads it when basebn's kernel
    library first loads (the first op), so call this before. Returns the default device now."""
    if omp_spin and "OMP_WAIT_POLICY" not in os.environ:
        os.environ.setdefault("GOMP_SPINCOUNT", str(INLINE_OMP_SPIN))
    CompNode._set_default_device(INLINE_CPU_DEVICE)
    return CompNode._get_default_device()


def tuning_wanted():
    """False where the user set ``BASEBN_TUNE_CPU=0`` (surrounding blanks ignored; any other value, or none, counts
    as unset): then neither ``import basebn`` nor a CLI applies :func:`tune_cpu_runtime` and
    :func:`lower_event_poller_priority`."""
    return os.environ.get(TUNE_SWITCH, "").strip() != "0"


def _threads(tasks_dir=_TASKS):
    """(thread id, name) of this process's threads, read from ``tasks_dir``; empty without /proc."""
    found = []
    try:
        tids = os.listdir(tasks_dir)
    except OSError:
        return found
    for tid in tids:
        try:
            with open(os.path.join(tasks_dir, tid, "comm")) as f:
                found.append((int(tid), f.read().strip()))
        except (OSError, ValueError):  # the thread ended, or not a thread id
            continue
    return found


def _thread_names(tasks_dir=_TASKS):
    """The names (``comm``) of this process's threads; empty without /proc."""
    return [name for _, name in _threads(tasks_dir)]


def megengine_has_run(tasks_dir=_TASKS):
    """Whether MegEngine ran an operation in this process already (so it has read its worker spin): importing it
    starts one "interpreter" thread, the first tensor a second one, its first result the event poller. False
    without /proc (Linux only)."""
    names = _thread_names(tasks_dir)
    return names.count("interpreter") > 1 or EVENT_POLLER_THREAD in names


@contextlib.contextmanager
def _stderr_silenced():
    """File descriptor 2 on /dev/null inside the block (MegEngine's C++ code writes there, not to sys.stderr)."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def quiet_device_probe(tune=None):
    """Probe for CUDA once with stderr silenced: on a CPU machine MegEngine prints a five-line banner and `debug:
    failed to load cuda func` lines at its first device query and its first tensor; after the probe nothing is
    silenced. Without CUDA and with ``tune`` (default: :func:`tuning_wanted`), :func:`tune_cpu_runtime` runs before
    the probe's first tensor (which reads the worker spin; MegEngine's warning that names the spin goes to the
    silenced stderr) and :func:`lower_event_poller_priority` after it (the tensor starts MegEngine's poller). With
    CUDA no tensor is made (it would hold a context on the first GPU). Returns whether MegEngine runs on the CPU."""
    if tune is None:
        tune = tuning_wanted()
    with _stderr_silenced():
        on_cpu = not mge.is_cuda_available()
        if on_cpu:
            if tune:
                tune_cpu_runtime()
            mge.tensor(0).numpy()
            if tune:
                _lower_poller_once_started()
    return on_cpu


def _lower_poller_once_started(tasks_dir=_TASKS, wait_s=POLLER_START_WAIT_S):
    """lower_event_poller_priority, retried until the poller thread exists: the first tensor starts it, but the
    thread names itself only once it runs, which on a loaded machine can come after the tensor's result."""
    deadline = time.monotonic() + wait_s
    while not lower_event_poller_priority(tasks_dir) and os.path.isdir(tasks_dir) and time.monotonic() < deadline:
        time.sleep(0.002)


def prepare_process():
    """What ``import basebn`` does, unless ``BASEBN_TUNE_CPU=0`` (then nothing): :func:`quiet_device_probe` with
    the tuning. Where MegEngine ran an operation before (:func:`megengine_has_run`) it has read its worker spin
    already: unless the user set ``MGB_WORKER_MAX_SPIN``, one RuntimeWarning says so and what to do (the other
    settings still take effect). Returns whether the process was tuned."""
    if not tuning_wanted():
        return False
    if megengine_has_run() and "MGB_WORKER_MAX_SPIN" not in os.environ:
        warnings.warn(f"basebn: MegEngine ran an operation before `import basebn`, so its idle worker still busy-waits "
                      f"~5 ms per wait, on a core the compute threads need: import basebn before the first tensor, or "
                      f"set MGB_WORKER_MAX_SPIN={WORKER_MAX_SPIN} in the environment ({TUNE_SWITCH}=0: basebn tunes "
                      f"nothing and says nothing)", RuntimeWarning, stacklevel=2)
    quiet_device_probe(tune=True)
    return True
