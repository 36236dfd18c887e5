"""Build, cache and load the C++/CUDA BN kernels (sources in ``basebn/kernels/``).

The library is compiled once per (sources, flags, MegEngine version) into
``kernel_cache_root()/<hash>``; an flock serialises concurrent builds. Loading is tried once per
process: :func:`load_kernels` remembers the library or the error.
"""
import ctypes
import hashlib
import os
import shutil
import subprocess
import threading
from typing import List, NamedTuple

from loguru import logger

import megengine as mge
from megengine.core.ops import custom
from megengine.core.ops.custom import get_custom_op_abi_tag
from megengine.utils import custom_op_tools

try:
    import fcntl
except ImportError:  # not POSIX: builds are not locked across processes
    fcntl = None

__all__ = [
    "KernelUnavailableError",
    "KernelBuildSpec",
    "CUDA_ARCHS",
    "OP_NAMES",
    "kernel_source_dir",
    "kernel_cache_root",
    "kernel_build_spec",
    "nvcc_supported_archs",
    "find_cuda_root",
    "load_kernels",
    "kernel_library",
    "kernel_available",
    "kernel_error",
]

_ENV_CACHE = "BASEBN_KERNEL_CACHE"
_ENV_SOURCES = "BASEBN_KERNEL_DIR"
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # basebn/
_CPU_SOURCES = ("bn_ops.cpp", "bn_cpu.cpp")
_CUDA_SOURCES = ("bn_cuda.cu",)
_HEADERS = ("bn_math.h", "bn_kernels.h")
_LIB_NAME = "basebn_bn"
# -O3 and no -march: portable binaries; -fopenmp-simd only honours `#pragma omp simd` (no
# OpenMP runtime), letting the compiler reorder those float reductions to vectorise them.
_CFLAGS = ("-O3", "-fopenmp-simd", "-DNDEBUG", "-pthread")
_LDFLAGS = ("-pthread",)
# oldest first; sm_70 (Volta) is gone from CUDA 13's nvcc, see tests/test_kernels_cuda_compile.py
CUDA_ARCHS = ("70", "75", "80", "90")
OP_NAMES = ("BasebnBnStats", "BasebnBnNormalize", "BasebnBnBackwardReduce", "BasebnBnBackwardElemt")


class KernelUnavailableError(RuntimeError):
    """The BN kernels were requested explicitly but could not be built or loaded."""


class KernelBuildSpec(NamedTuple):
    """Everything a build of the kernel library depends on; ``build_dir`` is keyed by its hash."""

    sources: List[str]
    headers: List[str]
    include_dirs: List[str]
    cflags: List[str]
    cuda_cflags: List[str]
    ldflags: List[str]
    with_cuda: bool
    build_dir: str


def kernel_source_dir():
    """Directory of the kernel sources: ``$BASEBN_KERNEL_DIR``, else ``kernels/`` inside the installed package."""
    return os.environ.get(_ENV_SOURCES) or os.path.join(_PACKAGE_DIR, "kernels")


def kernel_cache_root():
    """Root of the kernel build cache (``$BASEBN_KERNEL_CACHE`` or ``~/.cache/basebn/kernels``)."""
    root = os.environ.get(_ENV_CACHE) or os.path.join(os.path.expanduser("~"), ".cache", "basebn", "kernels")
    return os.path.abspath(root)


def nvcc_supported_archs(nvcc="nvcc", archs=CUDA_ARCHS):
    """The ``sm_XX`` numbers among ``archs`` that this nvcc can compile for."""
    try:
        out = subprocess.run([nvcc, "--list-gpu-arch"], capture_output=True, text=True, timeout=60,
                             check=True).stdout
    except Exception:  # noqa: BLE001 - old nvcc without the flag: assume all
        return list(archs)
    have = {line.strip().split("_")[-1] for line in out.split() if line.strip()}
    return [a for a in archs if a in have]


def find_cuda_root(nvcc=None):
    """The CUDA toolkit root (has include/cuda_runtime.h), or None.

    Tries $CUDA_ROOT_DIR, $CUDA_HOME, $CUDA_PATH, then asks nvcc itself (``-dryrun`` prints
    ``TOP=``: right even when nvcc on PATH is a wrapper script), then /usr/local/cuda.
    """
    cands = [os.environ.get(k) for k in ("CUDA_ROOT_DIR", "CUDA_HOME", "CUDA_PATH")]
    nvcc = nvcc or shutil.which("nvcc")
    if nvcc:
        try:
            out = subprocess.run([nvcc, "-dryrun", "-E", "-x", "cu", os.devnull],
                                 capture_output=True, text=True, timeout=60)
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
    """Build the CUDA part? (a GPU is visible, a toolkit is found, BASEBN_KERNEL_CUDA is not 0)."""
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
    # MegEngine guesses the root once at import from `which nvcc`; point it at the real one
    custom_op_tools.CUDA_ROOT_DIR = root
    return True


def kernel_build_spec(with_cuda, cuda_archs=CUDA_ARCHS):
    """The :class:`KernelBuildSpec` of the library, with the CUDA part for ``cuda_archs`` if ``with_cuda``.

    ``build_dir`` is ``kernel_cache_root()/<hash of sources, headers, flags, MegEngine version and
    custom-op ABI>`` (``-cuda`` appended for CUDA builds).
    """
    src_dir = kernel_source_dir()
    sources = [os.path.join(src_dir, f) for f in _CPU_SOURCES]
    headers = [os.path.join(src_dir, f) for f in _HEADERS]
    cflags = list(_CFLAGS)
    cuda_cflags = []
    if with_cuda:
        sources += [os.path.join(src_dir, f) for f in _CUDA_SOURCES]
        cflags.append("-DBASEBN_WITH_CUDA")
        cuda_cflags = ["-O3", "-DBASEBN_WITH_CUDA", "-std=c++14"]
        archs = nvcc_supported_archs(os.path.join(custom_op_tools.CUDA_ROOT_DIR, "bin", "nvcc"), cuda_archs)
        cuda_cflags += [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
        if archs:  # PTX of the newest arch: JIT-compiled on GPUs newer than the list
            cuda_cflags.append(f"-gencode=arch=compute_{archs[-1]},code=compute_{archs[-1]}")
    h = hashlib.sha256()
    for path in sources + headers:
        h.update(os.path.basename(path).encode())
        with open(path, "rb") as f:
            h.update(f.read())
    for part in (cflags, cuda_cflags, list(_LDFLAGS), [mge.__version__, str(get_custom_op_abi_tag())]):
        h.update(repr(part).encode())
    build_dir = os.path.join(kernel_cache_root(), h.hexdigest()[:16] + ("-cuda" if with_cuda else ""))
    return KernelBuildSpec(sources, headers, [src_dir], cflags, cuda_cflags, list(_LDFLAGS), with_cuda, build_dir)


def _flock(f, lock):
    if fcntl is not None:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX if lock else fcntl.LOCK_UN)


def _compile(spec):
    """Compile into ``spec.build_dir`` with MegEngine's ninja build; returns the library path."""
    stale = os.path.join(spec.build_dir, "lock")
    if os.path.exists(stale):  # the caller holds the flock: nobody else is building
        os.remove(stale)
    path = custom_op_tools.build_and_load(
        _LIB_NAME, spec.sources, extra_cflags=list(spec.cflags), extra_cuda_cflags=list(spec.cuda_cflags),
        extra_ldflags=list(spec.ldflags), extra_include_paths=list(spec.include_dirs),
        with_cuda=spec.with_cuda, build_dir=spec.build_dir)
    if path is None:  # megengine refuses a second build of one name in a process
        raise RuntimeError("build_and_load returned None (already built in-process)")
    return path


def _build_and_load():
    """Build (or reuse from the cache) and load the library; returns its info dict."""
    spec = kernel_build_spec(_cuda_wanted())
    lib_path = os.path.join(spec.build_dir, _LIB_NAME + "_v0.so")
    marker = os.path.join(spec.build_dir, "built.ok")
    os.makedirs(spec.build_dir, exist_ok=True)
    # Several processes (pytest workers, data-parallel ranks) may build at once. MegEngine's own
    # lock file makes the losers return a path without ".so" and is left behind by a killed
    # build; an flock (released when its process dies) serialises build + load instead.
    with open(os.path.join(spec.build_dir, "build.flock"), "w") as lock_file:
        _flock(lock_file, True)
        try:
            if os.path.exists(marker) and os.path.exists(lib_path):
                custom.load(lib_path)  # cached build: needs no compiler
            else:
                lib_path = _compile(spec)
                with open(marker, "w") as f:
                    f.write(lib_path + "\n")
        finally:
            _flock(lock_file, False)
    for op in OP_NAMES:
        if not hasattr(custom, op):
            raise RuntimeError(f"custom op {op} missing after loading {lib_path}")
    return {"path": lib_path, "cuda": spec.with_cuda, "build_dir": spec.build_dir,
            "self_sync": _mge_exports_sync_all()}


def _mge_exports_sync_all():
    """Does libmegengine_shared export mgb::CompNode::sync_all()? The CPU kernels then wait for
    MegEngine's queued work themselves (see kernels/bn_cpu.cpp); otherwise Python does it."""
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


def load_kernels(warn=False):
    """The loaded library's info dict (``path``, ``cuda``, ``build_dir``, ``self_sync``), or None.

    Builds/loads on the first call only. With ``warn``, the first failure is logged once.
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
