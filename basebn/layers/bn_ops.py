"""Raw BatchNorm ops (no autograd): statistics, normalisation and the two backward passes.

Two interchangeable implementations:

* ``"kernel"``: custom MegEngine ops written in C++ (multi-threaded CPU) and CUDA, compiled on
  first use from ``kernels/`` with ``megengine.utils.custom_op_tools.build_and_load`` into a cache
  directory keyed by a hash of the sources and flags (``~/.cache/basebn/kernels/<hash>``, override
  with ``BASEBN_KERNEL_CACHE``);
* ``"fallback"``: pure ``megengine.functional``, same numerics (float32 accumulation, two-pass
  statistics).

``BASEBN_BN_BACKEND=kernel|fallback|auto`` (default ``auto``) selects the path; ``auto`` uses the
kernels when they build and load, otherwise warns once and falls back. Forcing ``kernel`` when the
build fails raises :class:`KernelUnavailableError`. Tests switch paths with :func:`use_backend`.

Shapes: ``x`` and ``dy`` are (N, C, *) with 2 to 5 dims, float32 or float16 (float16 reaches
the kernels as float16; they accumulate in float32/double). Per-channel tensors (mean, invstd,
weight, bias, sums) are float32 of shape (C,). Empty tensors (N=0) take the fallback.

Other environment variables: ``BASEBN_NUM_THREADS`` (CPU kernel threads; default: the CPUs this
process may run on), ``BASEBN_KERNEL_CUDA=0`` (never build the CUDA part).

CPU kernels first wait for MegEngine's queued CPU work (see :func:`_kernel_ok`): MegEngine
1.13 runs CPU custom ops without waiting for it.
"""
import contextlib
import functools
import hashlib
import os
import threading

import numpy as np

import megengine as mge
import megengine.functional as F

__all__ = [
    "bn_stats",
    "bn_normalize",
    "bn_backward_reduce",
    "bn_backward_elemt",
    "backend",
    "use_backend",
    "kernel_available",
    "kernel_error",
    "KernelUnavailableError",
    "kernel_cache_root",
    "find_cuda_root",
    "copy_bandwidth_op",
]

_ENV_BACKEND = "BASEBN_BN_BACKEND"
_ENV_CACHE = "BASEBN_KERNEL_CACHE"
_VALID = ("kernel", "fallback", "auto")


class KernelUnavailableError(RuntimeError):
    """The BN kernels were requested explicitly but could not be built or loaded."""


# --------------------------------------------------------------------------------------------
# backend selection
# --------------------------------------------------------------------------------------------
_override = threading.local()


def _requested():
    req = getattr(_override, "value", None)
    if req is None:
        req = os.environ.get(_ENV_BACKEND, "auto").strip().lower() or "auto"
    if req not in _VALID:
        raise ValueError(f"{_ENV_BACKEND} must be one of {_VALID}, got {req!r}")
    return req


@contextlib.contextmanager
def use_backend(name):
    """Temporarily force ``"kernel"``, ``"fallback"`` or ``"auto"`` (this thread only)."""
    if name not in _VALID:
        raise ValueError(f"backend must be one of {_VALID}, got {name!r}")
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
    req = _requested()
    if req == "fallback":
        return "fallback"
    lib = _load_kernels(warn=(req == "auto"))
    if lib is not None:
        return "kernel"
    if req == "kernel":
        raise KernelUnavailableError(
            f"basebn BN kernels were requested ({_ENV_BACKEND}=kernel or use_backend('kernel')) "
            f"but could not be built/loaded: {_kernel_state['error']}"
        )
    return "fallback"


def kernel_available():
    """True when the custom-op kernels are built and loaded in this process."""
    return _load_kernels(warn=False) is not None


def kernel_error():
    """Why the kernels are unavailable (None when they loaded or were not tried)."""
    _load_kernels(warn=False)
    return _kernel_state["error"]


# --------------------------------------------------------------------------------------------
# fallback path: pure megengine.functional
# --------------------------------------------------------------------------------------------
def _check(x, name="x"):
    if x.ndim < 2 or x.ndim > 5:
        raise ValueError(f"{name} must have 2 to 5 dims (N, C, *), got shape {tuple(x.shape)}")
    if np.dtype(x.dtype) not in (np.float32, np.float16):
        raise TypeError(f"{name} must be float32 or float16, got {x.dtype}")


def _per_channel(v, c, name):
    if v is None:
        return None
    if not isinstance(v, mge.Tensor):
        v = mge.tensor(np.asarray(v, dtype=np.float32))
    if v.dtype != np.float32:
        v = v.astype("float32")
    if tuple(v.shape) != (c,):
        v = v.reshape(c)
    return v


def _bshape(x):
    return (1, x.shape[1]) + (1,) * (x.ndim - 2)


def _spatial(x):
    s = 1
    for v in x.shape[2:]:
        s *= int(v)
    return s


def _fb_stats(x):
    n, c, s = x.shape[0], x.shape[1], _spatial(x)
    cnt = n * s
    if cnt == 0:  # (reshape with -1 on an empty tensor crashes MegEngine 1.13)
        return F.zeros((c,), dtype="float32"), F.zeros((c,), dtype="float32")
    x3 = x.reshape(n, c, s)
    if x3.dtype != np.float32:
        x3 = x3.astype("float32")
    mean = F.sum(x3, axis=(0, 2)) / cnt
    d = x3 - mean.reshape(1, c, 1)
    m2 = F.sum(d * d, axis=(0, 2))
    return mean, m2


def _fb_normalize(x, mean, invstd, weight, bias):
    # (x - mean) * scale + bias, not x * scale + shift: no cancellation when |mean| >> std
    scale = invstd if weight is None else invstd * weight
    bs = _bshape(x)
    x32 = x if x.dtype == np.float32 else x.astype("float32")
    y = (x32 - mean.reshape(bs)) * scale.reshape(bs)
    if bias is not None:
        y = y + bias.reshape(bs)
    return y if y.dtype == x.dtype else y.astype(x.dtype)


def _fb_backward_reduce(dy, x, mean, invstd):
    n, c, s = x.shape[0], x.shape[1], _spatial(x)
    if n * s == 0:
        return F.zeros((c,), dtype="float32"), F.zeros((c,), dtype="float32")
    x3 = x.reshape(n, c, s)
    g3 = dy.reshape(n, c, s)
    if x3.dtype != np.float32:
        x3 = x3.astype("float32")
    if g3.dtype != np.float32:
        g3 = g3.astype("float32")
    sum_dy = F.sum(g3, axis=(0, 2))
    sum_dy_xc = F.sum(g3 * (x3 - mean.reshape(1, c, 1)), axis=(0, 2))
    return sum_dy, sum_dy_xc * invstd


def _fb_backward_elemt(dy, x, mean, invstd, weight, sum_dy, sum_dy_xhat, count):
    # dx = a * (dy - mdy - (x - mean) * k), a = w * invstd, mdy = sum_dy / count,
    # k = invstd * sum_dy_xhat / count
    inv_cnt = 1.0 / float(count) if count else 0.0
    a = invstd if weight is None else weight * invstd
    mdy = sum_dy * inv_cnt
    k = invstd * sum_dy_xhat * inv_cnt
    bs = _bshape(x)
    x32 = x if x.dtype == np.float32 else x.astype("float32")
    g32 = dy if dy.dtype == np.float32 else dy.astype("float32")
    dx = (g32 - mdy.reshape(bs) - (x32 - mean.reshape(bs)) * k.reshape(bs)) * a.reshape(bs)
    return dx if dx.dtype == dy.dtype else dx.astype(dy.dtype)


# --------------------------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------------------------
def bn_stats(x):
    """Per-channel ``(mean, m2)`` over N and all spatial dims, float32 (C,) each.

    ``m2 = sum((x - mean)**2)``; the count is ``N * prod(spatial)``. Numerically stable
    (two-pass in the fallback, Welford/Chan-merged blocks in the kernels). N=0 gives zeros.
    """
    _check(x)
    if backend() == "kernel":
        return _k_stats(x)
    return _fb_stats(x)


def bn_normalize(x, mean, invstd, weight=None, bias=None):
    """``y = (x - mean) * invstd * weight + bias`` with the dtype of ``x``."""
    _check(x)
    c = x.shape[1]
    mean, invstd = _per_channel(mean, c, "mean"), _per_channel(invstd, c, "invstd")
    weight, bias = _per_channel(weight, c, "weight"), _per_channel(bias, c, "bias")
    if backend() == "kernel":
        return _k_normalize(x, mean, invstd, weight, bias)
    return _fb_normalize(x, mean, invstd, weight, bias)


def bn_backward_reduce(dy, x, mean, invstd):
    """Per-channel ``(sum(dy), sum(dy * xhat))``, ``xhat = (x - mean) * invstd``, float32 (C,)."""
    _check(x)
    _check(dy, "dy")
    c = x.shape[1]
    mean, invstd = _per_channel(mean, c, "mean"), _per_channel(invstd, c, "invstd")
    if backend() == "kernel":
        return _k_backward_reduce(dy, x, mean, invstd)
    return _fb_backward_reduce(dy, x, mean, invstd)


def bn_backward_elemt(dy, x, mean, invstd, weight, sum_dy, sum_dy_xhat, count):
    """``dx = w * invstd * (dy - sum_dy/count - xhat * sum_dy_xhat/count)`` with dy's dtype.

    ``count`` is the global per-channel element count (may exceed the local one under SyncBN);
    ``weight=None`` means 1.
    """
    _check(x)
    _check(dy, "dy")
    c = x.shape[1]
    mean, invstd = _per_channel(mean, c, "mean"), _per_channel(invstd, c, "invstd")
    weight = _per_channel(weight, c, "weight")
    sum_dy = _per_channel(sum_dy, c, "sum_dy")
    sum_dy_xhat = _per_channel(sum_dy_xhat, c, "sum_dy_xhat")
    count = float(count)
    if backend() == "kernel":
        return _k_backward_elemt(dy, x, mean, invstd, weight, sum_dy, sum_dy_xhat, count)
    return _fb_backward_elemt(dy, x, mean, invstd, weight, sum_dy, sum_dy_xhat, count)


# --------------------------------------------------------------------------------------------
# kernel path
# --------------------------------------------------------------------------------------------
_kernel_state = {"tried": False, "lib": None, "error": None, "warned": False}
_kernel_lock = threading.Lock()


def _load_kernels(warn):
    if not _kernel_state["tried"]:
        with _kernel_lock:
            if not _kernel_state["tried"]:
                try:
                    _kernel_state["lib"] = _build_and_load()
                except Exception as exc:  # noqa: BLE001 - any build/load failure means fallback
                    _kernel_state["error"] = f"{type(exc).__name__}: {exc}"
                _kernel_state["tried"] = True
    if _kernel_state["lib"] is None and warn and not _kernel_state["warned"]:
        _kernel_state["warned"] = True
        from loguru import logger

        logger.warning(
            "basebn BN kernels unavailable, using the pure-MegEngine fallback: {}",
            _kernel_state["error"],
        )
    return _kernel_state["lib"]


_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KERNEL_DIR = os.environ.get("BASEBN_KERNEL_DIR") or os.path.join(_REPO_ROOT, "kernels")
_CPU_SOURCES = ("bn_ops.cpp", "bn_cpu.cpp")
_CUDA_SOURCES = ("bn_cuda.cu",)
_HEADERS = ("bn_math.h", "bn_kernels.h")
_LIB_NAME = "basebn_bn"
# -O3 and no -march: portable binaries; -fopenmp-simd only honours `#pragma omp simd` (no
# OpenMP runtime), letting the compiler reorder those float reductions to vectorise them.
_CFLAGS = ["-O3", "-fopenmp-simd", "-DNDEBUG", "-pthread"]
_LDFLAGS = ["-pthread"]
# oldest first; sm_70 (Volta) is gone from CUDA 13's nvcc, see tests/test_kernels_cuda_compile.py
CUDA_ARCHS = ("70", "75", "80", "90")


def kernel_cache_root():
    """Root of the kernel build cache (``BASEBN_KERNEL_CACHE`` or ``~/.cache/basebn/kernels``)."""
    root = os.environ.get(_ENV_CACHE)
    if not root:
        root = os.path.join(os.path.expanduser("~"), ".cache", "basebn", "kernels")
    return os.path.abspath(root)


def nvcc_supported_archs(nvcc="nvcc"):
    """The ``sm_XX`` numbers among :data:`CUDA_ARCHS` that this nvcc can compile for."""
    import subprocess

    try:
        out = subprocess.run(
            [nvcc, "--list-gpu-arch"], capture_output=True, text=True, timeout=60, check=True
        ).stdout
    except Exception:  # noqa: BLE001 - old nvcc without the flag: assume all
        return list(CUDA_ARCHS)
    have = {line.strip().split("_")[-1] for line in out.split() if line.strip()}
    return [a for a in CUDA_ARCHS if a in have]


def find_cuda_root(nvcc=None):
    """The CUDA toolkit root (has include/cuda_runtime.h), or None.

    Tries $CUDA_ROOT_DIR, $CUDA_HOME, $CUDA_PATH, then asks nvcc itself (``-dryrun`` prints
    ``TOP=``: works when nvcc on PATH is a wrapper script, where MegEngine's own guess,
    dirname(dirname(which nvcc)), is wrong), then /usr/local/cuda.
    """
    import shutil
    import subprocess

    cands = [os.environ.get(k) for k in ("CUDA_ROOT_DIR", "CUDA_HOME", "CUDA_PATH")]
    nvcc = nvcc or shutil.which("nvcc")
    if nvcc:
        try:
            out = subprocess.run(
                [nvcc, "-dryrun", "-E", "-x", "cu", os.devnull],
                capture_output=True, text=True, timeout=60,
            )
            for line in (out.stdout + out.stderr).splitlines():
                if "TOP=" in line:
                    cands.append(os.path.normpath(line.split("TOP=", 1)[1].strip()))
        except Exception:  # noqa: BLE001
            pass
        cands.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    cands.append("/usr/local/cuda")
    for root in cands:
        if root and os.path.exists(os.path.join(root, "include", "cuda_runtime.h")):
            return root
    return None


def _cuda_wanted():
    if os.environ.get("BASEBN_KERNEL_CUDA", "auto") == "0":
        return False
    try:
        if not mge.is_cuda_available():
            return False
    except Exception:  # noqa: BLE001
        return False
    root = find_cuda_root()
    if root is None:
        return False
    from megengine.utils import custom_op_tools as cot

    # MegEngine guesses the root once at import from `which nvcc`; point it at the real one
    cot.CUDA_ROOT_DIR = root
    return True


def _build_spec(with_cuda):
    from megengine.core.ops.custom import get_custom_op_abi_tag

    sources = [os.path.join(KERNEL_DIR, f) for f in _CPU_SOURCES]
    cflags = list(_CFLAGS)
    cuda_cflags = []
    if with_cuda:
        from megengine.utils import custom_op_tools as cot

        sources += [os.path.join(KERNEL_DIR, f) for f in _CUDA_SOURCES]
        cflags.append("-DBASEBN_WITH_CUDA")
        nvcc = os.path.join(cot.CUDA_ROOT_DIR, "bin", "nvcc")
        cuda_cflags = ["-O3", "-DBASEBN_WITH_CUDA", "-std=c++14"]
        archs = nvcc_supported_archs(nvcc)
        for arch in archs:
            cuda_cflags.append(f"-gencode=arch=compute_{arch},code=sm_{arch}")
        if archs:  # PTX of the newest arch: JIT-compiled on GPUs newer than the list
            cuda_cflags.append(f"-gencode=arch=compute_{archs[-1]},code=compute_{archs[-1]}")
    h = hashlib.sha256()
    for path in sources + [os.path.join(KERNEL_DIR, f) for f in _HEADERS]:
        h.update(os.path.basename(path).encode())
        with open(path, "rb") as f:
            h.update(f.read())
    for part in (cflags, cuda_cflags, _LDFLAGS, [mge.__version__, str(get_custom_op_abi_tag())]):
        h.update(repr(part).encode())
    build_dir = os.path.join(kernel_cache_root(), h.hexdigest()[:16] + ("-cuda" if with_cuda else ""))
    return sources, cflags, cuda_cflags, build_dir


def _flock(f, lock):
    try:
        import fcntl
    except ImportError:  # not POSIX: no inter-process lock
        return
    fcntl.flock(f.fileno(), fcntl.LOCK_EX if lock else fcntl.LOCK_UN)


def _build_and_load():
    """Build (or reuse from the cache) and load the kernel library; returns a small info dict."""
    from megengine.core.ops import custom

    with_cuda = _cuda_wanted()
    sources, cflags, cuda_cflags, build_dir = _build_spec(with_cuda)
    lib_path = os.path.join(build_dir, _LIB_NAME + "_v0.so")
    marker = os.path.join(build_dir, "built.ok")
    os.makedirs(build_dir, exist_ok=True)
    # Several processes (pytest workers, data-parallel ranks) may build at once. MegEngine's own
    # lock file makes the losers return a path without ".so" (load fails) and is left behind for
    # ever by a killed build; an flock (released by the kernel when a process dies) serialises
    # the whole build + load instead.
    with open(os.path.join(build_dir, "build.flock"), "w") as lock_file:
        _flock(lock_file, True)
        try:
            if os.path.exists(marker) and os.path.exists(lib_path):
                custom.load(lib_path)  # cached build: needs no compiler
            else:
                from megengine.utils.custom_op_tools import build_and_load

                stale = os.path.join(build_dir, "lock")
                if os.path.exists(stale):  # we hold the flock: nobody else is building
                    os.remove(stale)
                path = build_and_load(
                    _LIB_NAME,
                    sources,
                    extra_cflags=list(cflags),
                    extra_cuda_cflags=list(cuda_cflags),
                    extra_ldflags=list(_LDFLAGS),
                    extra_include_paths=[KERNEL_DIR],
                    with_cuda=with_cuda,
                    build_dir=build_dir,
                )
                if path is None:  # megengine refuses a second build of one name in a process
                    raise RuntimeError("build_and_load returned None (already built in-process)")
                lib_path = path
                with open(marker, "w") as f:
                    f.write(lib_path + "\n")
        finally:
            _flock(lock_file, False)
    for op in ("BasebnBnStats", "BasebnBnNormalize", "BasebnBnBackwardReduce", "BasebnBnBackwardElemt"):
        if not hasattr(custom, op):
            raise RuntimeError(f"custom op {op} missing after loading {lib_path}")
    return {"path": lib_path, "cuda": with_cuda, "self_sync": _mge_exports_sync_all()}


def _mge_exports_sync_all():
    """Does libmegengine_shared export mgb::CompNode::sync_all()? The CPU kernels then wait for
    MegEngine's queued work themselves (see kernels/bn_cpu.cpp); otherwise Python does it."""
    import ctypes

    from megengine.utils.custom_op_tools import MGE_LIB_PATH

    try:
        lib = ctypes.CDLL(os.path.join(MGE_LIB_PATH, "libmegengine_shared.so"))
        getattr(lib, "_ZN3mgb8CompNode8sync_allEv")
        return True
    except (OSError, AttributeError):
        return False


@functools.lru_cache(maxsize=512)
def _op(name, **params):
    from megengine.core.ops import custom

    return getattr(custom, name)(**params)


def _apply(name, *inputs, **params):
    from megengine.core._imperative_rt.core2 import apply

    return apply(_op(name, **params), *inputs)


# tests flip this to run the kernels' non-contiguous (gather) code path on contiguous tensors
_FORCE_STRIDED = False


def _kernel_ok(x, *others):
    """Kernel path for x? (False for empty tensors and for GPU tensors without CUDA kernels.)

    MegEngine 1.13 runs a CPU custom op's compute without waiting for the CPU comp node's queue
    (imperative/src/impl/ops/custom_opdef.cpp apply_on_physical_tensor: no sync; the graph
    CustomOpNode syncs only after compute; CUDA is fine: kernels go on the same stream). Two races
    follow, both measured here as wrong results (zeros, stale data):
      1. inputs written by ops still queued (any producer op, even the host->device copy of a
         fresh ``mge.tensor(np_array)``) are read before they are written;
      2. a non-contiguous input (transpose, slice, ``F.broadcast_to``...) is made contiguous
         inside apply by an *asynchronous* copy the compute does not wait for.
    The CPU kernels call ``mgb::CompNode::sync_all()`` first when libmegengine_shared exports it
    (it does in 1.13; this also covers compiled ``jit.trace`` graphs, where no Python runs).
    Otherwise: ``Tensor._dev_tensor()`` runs the to-contiguous conversion now and
    ``_full_sync()`` drains the queue before the op is issued.
    """
    if x.size == 0:
        return False  # empty tensors: the fallback handles them with no kernel launch
    lib = _kernel_state["lib"]
    if str(x.device.physical_name).startswith("gpu"):
        if not lib["cuda"]:
            if _requested() == "kernel":
                raise KernelUnavailableError("basebn BN kernels were built without CUDA")
            return False
        return True
    if lib["self_sync"] or _symbolic_tracing():
        return True  # (symbolic trace: values do not exist yet, _dev_tensor() would crash)
    for t in (x,) + others:
        if t is not None:
            t._dev_tensor()
    mge._full_sync()
    return True


def _symbolic_tracing():
    """Inside ``jit.trace(symbolic=True)`` (values do not exist; _dev_tensor() would crash)."""
    try:
        from megengine.jit import tracing
    except ImportError:  # pragma: no cover
        return False
    if not tracing.is_tracing():
        return False
    tr = getattr(tracing.active_trace, "_trace", None)
    return bool(getattr(tr, "symbolic", True))  # unknown: assume symbolic (the safe side)


def _same_dtype(dy, x):
    if dy.dtype == x.dtype:
        return dy, x
    return dy.astype("float32"), x.astype("float32")


def _k_stats(x):
    if not _kernel_ok(x):
        return _fb_stats(x)
    mean, m2 = _apply("BasebnBnStats", x, force_strided=_FORCE_STRIDED)
    return mean, m2


def _k_normalize(x, mean, invstd, weight, bias):
    if not _kernel_ok(x, mean, invstd, weight, bias):
        return _fb_normalize(x, mean, invstd, weight, bias)
    (y,) = _apply(
        "BasebnBnNormalize",
        x,
        mean,
        invstd,
        mean if weight is None else weight,
        mean if bias is None else bias,
        has_weight=weight is not None,
        has_bias=bias is not None,
        force_strided=_FORCE_STRIDED,
    )
    return y


def _k_backward_reduce(dy, x, mean, invstd):
    if dy.dtype != x.dtype:
        dy, x = _same_dtype(dy, x)
    if not _kernel_ok(x, dy, mean, invstd):
        return _fb_backward_reduce(dy, x, mean, invstd)
    s1, s2 = _apply("BasebnBnBackwardReduce", dy, x, mean, invstd, force_strided=_FORCE_STRIDED)
    return s1, s2


def _k_backward_elemt(dy, x, mean, invstd, weight, sum_dy, sum_dy_xhat, count):
    out_dtype = dy.dtype
    if dy.dtype != x.dtype:
        dy, x = _same_dtype(dy, x)
    if not _kernel_ok(x, dy, mean, invstd, weight, sum_dy, sum_dy_xhat):
        return _fb_backward_elemt(dy, x, mean, invstd, weight, sum_dy, sum_dy_xhat, count)
    (dx,) = _apply(
        "BasebnBnBackwardElemt",
        dy,
        x,
        mean,
        invstd,
        mean if weight is None else weight,
        sum_dy,
        sum_dy_xhat,
        has_weight=weight is not None,
        count=float(count),
        force_strided=_FORCE_STRIDED,
    )
    return dx if dx.dtype == out_dtype else dx.astype(out_dtype)


def copy_bandwidth_op(x, reps=1):
    """Multi-threaded C++ copy of a float32 tensor, ``reps`` times, through the kernel library
    (benchmark bandwidth probe)."""
    if _load_kernels(warn=False) is None:
        raise KernelUnavailableError(_kernel_state["error"])
    _kernel_ok(x)
    (y,) = _apply("BasebnCopy", x, reps=int(reps))
    return y
