"""The one custom-op library: the C++/CUDA BN kernels and the oneDNN conv and max-pool ops (``basebn/ops/csrc/``).

MegEngine loads one custom-op library per process, so :mod:`.bn_ops`, :mod:`.conv_ops` and :mod:`.pool_ops`
share this one, built as :func:`.kernel_build.kernel_build_spec` says into its cache directory (an flock
serialises concurrent builds) and loaded once per process (:func:`load_kernels` remembers the library
or the error). A build records the library's size and sha256 beside it (``built.ok``); a cached library that does
not match its record is never mapped (a truncated one would kill the process with SIGBUS): it is rebuilt in place
with one warning, or, in a read-only cache, left unloaded with the reason. A read-only cache with a matching
library loads it. The conv ops are compiled in when oneDNN is found; if that build fails, the BN-only
library is built instead and the failure is recorded in the cache (:func:`conv_kernel_error` says
why), so later processes with the same sources, flags and compiler skip it. The max-pool ops build with the conv
ops: :func:`conv_kernel_available` covers both.
:func:`wait_for_inputs` is what every op launch does first. Environment: ``BASEBN_KERNEL_CACHE``,
``BASEBN_KERNEL_DIR``, ``BASEBN_KERNEL_CUDA=0``, ``BASEBN_ONEDNN_ROOT``, ``OMP_WAIT_POLICY``
(:func:`set_default_omp_wait_policy`); ``BASEBN_NUM_THREADS`` is read by the CPU kernels.
Design notes: docs/bn_design.md.
"""
import contextlib
import ctypes
import errno
import json
import os
import threading
import time
from typing import Any, Dict, Optional

from loguru import logger

import megengine as mge
from megengine.core.ops import custom
from megengine.jit import tracing
from megengine.utils import custom_op_tools

from ..utils.fs import atomic_write_bytes, file_lock, sha256_of
from ..utils.progress import announced_step
from .kernel_build import (
    cuda_wanted,
    kernel_build_spec,
    no_onednn_reason,
    record_onednn_build_failure,
)

__all__ = [
    "KernelUnavailableError",
    "OP_NAMES",
    "ACT_OP_NAMES",
    "CONV_OP_NAMES",
    "POOL_OP_NAMES",
    "MATMUL_OP_NAMES",
    "RUNNING_OP_NAMES",
    "set_default_omp_wait_policy",
    "load_kernels",
    "kernel_library",
    "kernel_available",
    "kernel_error",
    "conv_kernel_available",
    "conv_kernel_error",
    "symbolic_tracing",
    "has_values",
    "wait_for_inputs",
]

OP_NAMES = ("BasebnBnStats", "BasebnBnNormalize", "BasebnBnBackwardReduce", "BasebnBnBackwardElemt")
"""The BN ops, always in the library."""
# the fused BN -> activation ops (basebn/ops/csrc/bn_act_cpu.cpp), also always in the library
ACT_OP_NAMES = ("BasebnBnActNormalize", "BasebnBnAddActNormalize", "BasebnBnActBackwardReduce",
                "BasebnBnActBackwardElemt", "BasebnBnAddActBackwardElemt")
"""The fused BN -> activation ops, always in the library."""
# only with oneDNN
CONV_OP_NAMES = ("BasebnConvFwd", "BasebnConvBwdData", "BasebnConvBwdFilter", "BasebnConvBwd")
"""The oneDNN conv ops, in the library when it is built with oneDNN."""
POOL_OP_NAMES = ("BasebnMaxPoolFwd", "BasebnMaxPoolBwd")  # only with oneDNN (basebn/ops/csrc/pool_dnnl.cpp)
"""The max-pool ops, only with oneDNN."""
MATMUL_OP_NAMES = ("BasebnMatMul",)  # only with oneDNN (basebn/ops/csrc/matmul_dnnl.cpp)
"""The matmul op, only with oneDNN."""
RUNNING_OP_NAMES = ("BasebnBnRunningUpdate",)  # the guarded running-statistics update (bn_running_cpu.cpp), CPU
"""The guarded running-statistics update op, CPU builds."""


class KernelUnavailableError(RuntimeError):
    """The BN kernels were requested explicitly but could not be built or loaded."""


class KernelBuildError(RuntimeError):
    """The compiler (MegEngine's ninja build) failed: what a oneDNN build's failure record is about."""


_RECORD = "built.ok"  # JSON: the library's file name, size and sha256, written once its build completed
_READ_ONLY_ERRNOS = (errno.EROFS, errno.EACCES, errno.EPERM)


def _compile(spec):
    """Compile into ``spec.build_dir`` with MegEngine's ninja build and load it; returns the library path.
    Raises :class:`KernelBuildError` when that fails."""
    stale = os.path.join(spec.build_dir, "lock")
    if os.path.exists(stale):  # the caller holds the flock: nobody else is building
        os.remove(stale)
    try:
        path = custom_op_tools.build_and_load(
            spec.lib_name, spec.sources, extra_cflags=list(spec.cflags), extra_cuda_cflags=list(spec.cuda_cflags),
            extra_ldflags=list(spec.ldflags), extra_include_paths=list(spec.include_dirs),
            with_cuda=spec.with_cuda, build_dir=spec.build_dir)
    except Exception as exc:  # noqa: BLE001 - ninja's RuntimeError, a missing compiler or ninja, a failed load
        raise KernelBuildError(str(exc) or type(exc).__name__) from exc
    if path is None:  # megengine refuses a second build of one name in a process
        raise KernelBuildError("build_and_load returned None (already built in-process)")
    return path


def _announced_compile(spec):
    """:func:`_compile` with a line before it (what, about how long, where it is cached), a line every
    HEARTBEAT_S while ninja runs (the sources compiled so far) and one with the time taken."""
    cores = os.cpu_count() or 1
    parts = ", ".join(["the BN ops"] + (["the oneDNN conv/pool/matmul ops"] if spec.onednn is not None else [])
                      + (["CUDA"] if spec.with_cuda else []))
    expected = (f"{parts}; first use of this build, about {_expected_minutes(spec, cores)} min on {cores} "
                f"core(s); cached in {spec.build_dir}")
    since = time.time()
    return announced_step(lambda: _compile(spec), "building basebn's C++ ops", expected, log=logger.info,
                          status=lambda: _compiled_so_far(spec, since))


def _expected_minutes(spec, cores):
    """A rough build time in whole minutes: ~3.5 core-minutes of C++ over the sources (1 min 46 s on 2 cores,
    the largest file at least ~45 s), several times that with CUDA (nvcc, one pass per architecture)."""
    seconds = max(45.0, 210.0 / max(1, min(cores, len(spec.sources))))
    if spec.with_cuda:
        seconds *= 4
    return max(1, round(seconds / 60))


def _compiled_so_far(spec, since):
    """"N of M sources compiled": the object files ninja has written in the build directory since `since`."""
    done = 0
    for source in spec.sources:
        stem = os.path.splitext(os.path.basename(source))[0]
        obj = os.path.join(spec.build_dir, stem + (".cuda.o" if source.endswith(".cu") else ".o"))
        try:
            done += os.path.getmtime(obj) >= since
        except OSError:
            pass
    return f"{done} of {len(spec.sources)} sources compiled"


def _record_library(lib_path):
    """Write the size and sha256 of the just-built (and loaded) ``lib_path`` beside it, atomically: whole or absent.
    A record that cannot be written costs only a relink in the next process."""
    record = {"library": os.path.basename(lib_path), "size": os.path.getsize(lib_path), "sha256": sha256_of(lib_path)}
    try:
        atomic_write_bytes(os.path.join(os.path.dirname(lib_path), _RECORD), (json.dumps(record) + "\n").encode())
    except OSError as exc:
        logger.warning("basebn kernel library {}: cannot record its size and sha256 ({}); the next process relinks it",
                       lib_path, exc)


def _library_problem(lib_path):
    """None when ``lib_path`` matches the record its build wrote; else ``(what is wrong, damaged)``: ``damaged`` when
    a record exists but the file does not match it (an interrupted or older build leaves no record)."""
    try:
        with open(os.path.join(os.path.dirname(lib_path), _RECORD)) as f:
            record = json.load(f)
    except (OSError, ValueError):
        record = None
    if not isinstance(record, dict) or record.get("library") != os.path.basename(lib_path):
        return "has no size and sha256 record of a completed build", False
    if not os.path.isfile(lib_path):
        return "is missing", True
    size = os.path.getsize(lib_path)
    if size != record.get("size"):
        return f"is {size} bytes, but its build wrote {record.get('size')} (truncated or damaged)", True
    if sha256_of(lib_path) != record.get("sha256"):
        return "does not have the sha256 its build recorded (damaged)", True
    return None


@contextlib.contextmanager
def _build_lock(build_dir):
    """Hold the build directory's flock for the block; yields False (no lock taken) where the cache is read-only.

    Several processes (pytest workers, data-parallel ranks) may build at once. MegEngine's own lock file makes the
    losers return a path without ".so" and is left behind by a killed build; an flock (released when its process
    dies) serialises build + load instead."""
    path = os.path.join(build_dir, "build.flock")
    try:
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o666))
    except OSError as exc:
        if exc.errno not in _READ_ONLY_ERRNOS:
            raise
        yield False  # nobody can build in a read-only cache: nothing to wait for
        return
    with file_lock(path, on_wait=lambda: logger.info(f"waiting for another process building basebn's C++ ops in "
                                                     f"{build_dir}")):
        yield True


def set_default_omp_wait_policy():
    """Set ``OMP_WAIT_POLICY=PASSIVE`` unless the user set it; returns the policy in effect.

    libgomp comes in with the oneDNN library and reads this once, when it is loaded, so this runs
    before the library loads. libgomp's default (active) keeps the conv ops' OpenMP threads spinning
    after each op, on the cores MegEngine's own ops then need: a ResNet-20 step at 2 threads went
    800 -> 485 ms with PASSIVE (benchmarks/bench_train_step.py). A user's value wins.
    """
    return os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _build_and_load():
    """Build (or reuse from the cache) and load the library; returns its info dict.

    With oneDNN, a failed build is recorded (:func:`.kernel_build.record_onednn_build_failure`) and the BN-only
    library is built; a oneDNN library that does not load (a damaged read-only cache, a missing libdnnl) is not
    recorded: the next process tries it again.
    """
    set_default_omp_wait_policy()  # before the library (and libgomp with it) is loaded
    with_cuda = cuda_wanted()
    spec = kernel_build_spec(with_cuda)
    if spec.onednn is None:
        return dict(_load_spec(spec), conv=False, onednn=None, conv_error=no_onednn_reason(with_cuda))
    try:
        return dict(_load_spec(spec), conv=True, onednn=spec.onednn.version, conv_error=None)
    except KernelBuildError as exc:  # keep the BN kernels: build them without oneDNN
        conv_error = f"the build with oneDNN {spec.onednn.version} failed: {_compiler_errors(exc)}"
        record_onednn_build_failure(spec, conv_error)
    except Exception as exc:  # noqa: BLE001 - the same, unrecorded
        conv_error = f"the library with oneDNN {spec.onednn.version} did not load: {_described(exc)}"
    try:
        return dict(_load_spec(kernel_build_spec(with_cuda, onednn=None)), conv=False, onednn=None,
                    conv_error=conv_error)
    except Exception as exc:  # noqa: BLE001 - say what happened first
        raise RuntimeError(f"{conv_error}; the library without oneDNN: {_described(exc)}") from exc


def _described(exc):
    """A RuntimeError's message (basebn's own, written to be read), else the exception's type and message."""
    return str(exc) if type(exc) is RuntimeError else f"{type(exc).__name__}: {exc}"


def _compiler_errors(exc):
    """The error lines of a failed build (one line), else the exception itself."""
    lines = [ln.strip() for ln in str(exc).splitlines() if "error" in ln.lower() and not ln.startswith("[")]
    return " | ".join(lines[:6]) if lines else f"{type(exc).__name__}: {exc}"


def _load_spec(spec):
    """Load the library of ``spec`` from the cache when it matches its record, else build it there and record it;
    checks the ops it must hold."""
    lib_path = os.path.join(spec.build_dir, spec.lib_name + "_v0.so")
    os.makedirs(spec.build_dir, exist_ok=True)
    with _build_lock(spec.build_dir) as writable:
        problem = _library_problem(lib_path)
        if problem is None:
            custom.load(lib_path)  # cached build: needs no compiler
        elif not writable:
            raise RuntimeError(f"the kernel library {lib_path} {problem[0]}, and its cache is read-only, so it cannot "
                               f"be rebuilt: point $BASEBN_KERNEL_CACHE at a writable folder")
        else:
            what, damaged = problem
            if damaged:
                logger.warning("basebn kernel library {} {}: rebuilding it (not loading it)", lib_path, what)
            if os.path.lexists(lib_path):  # never mapped; ninja relinks a missing library from its objects
                os.remove(lib_path)
            lib_path = _announced_compile(spec)
            _record_library(lib_path)
    dnnl_ops = CONV_OP_NAMES + POOL_OP_NAMES + MATMUL_OP_NAMES if spec.onednn is not None else ()
    for op in OP_NAMES + ACT_OP_NAMES + RUNNING_OP_NAMES + dnnl_ops:
        if not hasattr(custom, op):
            raise RuntimeError(f"custom op {op} missing after loading {lib_path}")
    return {"path": lib_path, "cuda": spec.with_cuda, "build_dir": spec.build_dir,
            "self_sync": _mge_exports_sync_all()}


def _mge_exports_sync_all():
    """Does libmegengine_shared export mgb::CompNode::sync_all()? The CPU kernels then wait for
    MegEngine's queued work themselves (see csrc/bn_cpu.cpp); otherwise Python does it."""
    try:
        lib = ctypes.CDLL(os.path.join(custom_op_tools.MGE_LIB_PATH, "libmegengine_shared.so"))
        getattr(lib, "_ZN3mgb8CompNode8sync_allEv")
        return True
    except (OSError, AttributeError):
        return False


class _LoadState:
    """The outcome of this process's one load attempt."""

    def __init__(self, tried=False, library=None, error=None):
        self.tried, self.library, self.error, self.warned = tried, library, error, False


_state = _LoadState()
_lock = threading.Lock()


def load_kernels(warn: bool = False) -> Optional[Dict[str, Any]]:
    """The loaded library's info dict, or None.

    Keys: ``path``, ``cuda``, ``build_dir``, ``self_sync``, ``conv`` (the oneDNN conv ops are in it),
    ``onednn`` (its version) and ``conv_error`` (why they are not).

    Builds/loads on the first call only.

    Args:
        warn: log the first failure (once).
    """
    state = _state
    if not state.tried:
        with _lock:
            if not state.tried:
                try:
                    state.library = _build_and_load()
                except Exception as exc:  # noqa: BLE001 - any build/load failure means fallback
                    state.error = f"{type(exc).__name__}: {exc}"
                state.tried = True
    if state.library is None and warn and not state.warned:
        state.warned = True
        logger.warning("basebn BN kernels unavailable, using the pure-MegEngine fallback: {}", state.error)
    return state.library


def kernel_library():
    """Info dict of the loaded kernel library (``path``, ``cuda``, ``build_dir``, ``self_sync``), or None."""
    return load_kernels(warn=False)


def kernel_available():
    """True when the custom-op kernels are built and loaded in this process."""
    return load_kernels(warn=False) is not None


def kernel_error():
    """Why the kernels are unavailable (None when they loaded)."""
    load_kernels(warn=False)
    return _state.error


def conv_kernel_available():
    """True when the oneDNN conv ops (and with them the max-pool ops) are built into the loaded kernel library."""
    lib = load_kernels(warn=False)
    return bool(lib is not None and lib.get("conv"))


def conv_kernel_error():
    """Why the oneDNN conv ops are unavailable (None when they loaded)."""
    lib = load_kernels(warn=False)
    if lib is None:
        return f"the kernel library did not build or load: {_state.error}"
    return lib.get("conv_error")


def symbolic_tracing():
    """Inside ``jit.trace(symbolic=True)`` (values do not exist yet; _dev_tensor() would crash)."""
    if not tracing.is_tracing():
        return False
    tr = getattr(tracing.active_trace, "_trace", None)
    return bool(getattr(tr, "symbolic", True))  # unknown: assume symbolic (the safe side)


def has_values(x: mge.Tensor) -> bool:
    """False when tensor ``x`` has a zero dimension. A tuple test: ``Tensor.size`` is a numpy product (~8 us a
    call, many per layer and step); under ``jit.trace``, where the shape can be a Tensor, ``x.size > 0``.

    Args:
        x: a tensor.
    """
    shape = x.shape
    return 0 not in shape if isinstance(shape, tuple) else bool(x.size > 0)


def wait_for_inputs(*tensors: Optional[mge.Tensor]) -> None:
    """Make CPU ``tensors`` (None entries ignored) safe for the library's ops to read; call before a launch.

    MegEngine 1.13 runs a CPU custom op without waiting for the CPU comp node's queue. Two races
    follow (both seen as wrong results): inputs still being written by queued ops, and the
    asynchronous to-contiguous copy of non-contiguous inputs. When the library's ops call
    ``mgb::CompNode::sync_all()`` themselves (MegEngine 1.13 exports it; this also covers compiled
    ``jit.trace`` graphs) nothing is done here; otherwise ``_dev_tensor()`` runs the conversion now
    and ``_full_sync()`` drains the queue. The library must be loaded (:func:`load_kernels`).

    Args:
        *tensors: the op's inputs; None entries are ignored.
    """
    lib = load_kernels()
    if lib["self_sync"] or symbolic_tracing():
        return
    for t in tensors:
        if t is not None:
            t._dev_tensor()
    mge._full_sync()
