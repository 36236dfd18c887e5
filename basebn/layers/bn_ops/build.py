"""Build, cache and load the C++/CUDA BN kernels and the oneDNN conv ops (sources in ``basebn/kernels/``).

The library is compiled once per (sources, flags, MegEngine version, oneDNN) into
``kernel_cache_root()/<hash>``; an flock serialises concurrent builds. Loading is tried once per
process: :func:`load_kernels` remembers the library or the error. MegEngine loads one custom-op
library per process, so the conv ops (``conv_dnnl.cpp``, when :func:`find_onednn` finds oneDNN) are
compiled into the BN library; if that build fails, the BN-only library is built instead and the
failure is recorded in its cache directory (``conv_kernel_error()``), so later processes skip it.
"""
import ctypes
import glob
import hashlib
import os
import re
import shutil
import site
import subprocess
import sys
import threading
from typing import List, NamedTuple, Optional

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
    "CONV_OP_NAMES",
    "OneDNN",
    "find_onednn",
    "kernel_source_dir",
    "kernel_cache_root",
    "kernel_build_spec",
    "nvcc_supported_archs",
    "find_cuda_root",
    "load_kernels",
    "kernel_library",
    "kernel_available",
    "kernel_error",
    "conv_kernel_available",
    "conv_kernel_error",
]

_ENV_CACHE = "BASEBN_KERNEL_CACHE"
_ENV_SOURCES = "BASEBN_KERNEL_DIR"
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # basebn/
_CPU_SOURCES = ("bn_ops.cpp", "bn_cpu.cpp")
_CUDA_SOURCES = ("bn_cuda.cu",)
_HEADERS = ("bn_math.h", "bn_kernels.h", "strided_copy.h", "queued_work.h")
_DNNL_SOURCES = ("conv_dnnl.cpp",)
_LIB_NAME = "basebn_bn"
_DNNL_LIB_NAME = "basebn_bn_dnnl"  # another name: a failed oneDNN build can be followed by the BN-only one
_DNNL_FAILED = "dnnl_failed.txt"
_ENV_ONEDNN = "BASEBN_ONEDNN_ROOT"
# -O3 and no -march: portable binaries; -fopenmp-simd only honours `#pragma omp simd` (no
# OpenMP runtime), letting the compiler reorder those float reductions to vectorise them.
_CFLAGS = ("-O3", "-fopenmp-simd", "-DNDEBUG", "-pthread")
_LDFLAGS = ("-pthread",)
# oldest first; sm_70 (Volta) is gone from CUDA 13's nvcc, see tests/test_kernels_cuda_compile.py
CUDA_ARCHS = ("70", "75", "80", "90")
OP_NAMES = ("BasebnBnStats", "BasebnBnNormalize", "BasebnBnBackwardReduce", "BasebnBnBackwardElemt")
CONV_OP_NAMES = ("BasebnConvFwd", "BasebnConvBwdData", "BasebnConvBwdFilter")  # only with oneDNN


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
    onednn: Optional["OneDNN"] = None  # set: the conv ops are compiled in
    lib_name: str = _LIB_NAME


class OneDNN(NamedTuple):
    """A oneDNN installation the conv ops can build against."""

    root: str
    include_dir: str
    lib_dir: str
    link: str  # the -l argument: "dnnl", or ":libdnnl.so.3" without the unversioned link
    version: str  # "3.2.0 (commit hash)" from dnnl_version.h


def _onednn_at(root):
    """The :class:`OneDNN` under ``root``, or None."""
    inc, lib = os.path.join(root, "include"), os.path.join(root, "lib")
    header = os.path.join(inc, "oneapi", "dnnl", "dnnl_version.h")
    libs = sorted(os.path.basename(p) for p in glob.glob(os.path.join(lib, "libdnnl.so*")))
    if not (os.path.exists(os.path.join(inc, "oneapi", "dnnl", "dnnl.hpp")) and os.path.exists(header) and libs):
        return None
    with open(header) as f:
        fields = dict(re.findall(r'#define DNNL_VERSION_(MAJOR|MINOR|PATCH|HASH)\s+"?([^"\s]+)', f.read()))
    version = "{}.{}.{} ({})".format(*(fields.get(k, "?") for k in ("MAJOR", "MINOR", "PATCH", "HASH")))
    return OneDNN(os.path.abspath(root), inc, lib, "dnnl" if "libdnnl.so" in libs else ":" + libs[0], version)


def find_onednn():
    """The oneDNN to build the conv ops with (:class:`OneDNN`), or None.

    ``$BASEBN_ONEDNN_ROOT`` when set (the only place then; point it at a missing directory to build
    without oneDNN), else ``sys.prefix`` (a venv with the pip wheels ``onednn-cpu-gomp`` and
    ``onednn-devel-cpu-gomp``), else the user site base. A root has ``include/oneapi/dnnl/dnnl.hpp``
    and ``lib/libdnnl.so*``.
    """
    env = os.environ.get(_ENV_ONEDNN)
    roots = [env] if env else [sys.prefix, site.getuserbase()]
    for root in roots:
        found = _onednn_at(root) if root else None
        if found is not None:
            return found
    return None


def _searched_onednn_roots():
    env = os.environ.get(_ENV_ONEDNN)
    return f"${_ENV_ONEDNN}={env}" if env else f"{sys.prefix} and {site.getuserbase()}"


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


_AUTO = "auto"


def kernel_build_spec(with_cuda, cuda_archs=CUDA_ARCHS, onednn=_AUTO):
    """The :class:`KernelBuildSpec` of the library, with the CUDA part for ``cuda_archs`` if ``with_cuda``.

    ``onednn``: a :class:`OneDNN` to compile the conv ops against, None for the BN-only library, or
    ``"auto"``: :func:`find_onednn`, unless ``conv_dnnl.cpp`` is missing or a build with it failed before.
    ``build_dir`` is ``kernel_cache_root()/<hash of sources, headers, flags, MegEngine version,
    custom-op ABI and oneDNN root/version>`` (``-cuda`` appended for CUDA builds).
    """
    if onednn == _AUTO:
        spec = kernel_build_spec(with_cuda, cuda_archs, None)
        have_sources = all(os.path.exists(os.path.join(kernel_source_dir(), f)) for f in _DNNL_SOURCES)
        onednn = find_onednn() if have_sources else None
        if onednn is None:
            return spec
        dnnl_spec = kernel_build_spec(with_cuda, cuda_archs, onednn)
        return spec if os.path.exists(os.path.join(dnnl_spec.build_dir, _DNNL_FAILED)) else dnnl_spec
    src_dir = kernel_source_dir()
    sources = [os.path.join(src_dir, f) for f in _CPU_SOURCES]
    headers = [os.path.join(src_dir, f) for f in _HEADERS]
    cflags = list(_CFLAGS)
    ldflags = list(_LDFLAGS)
    include_dirs = [src_dir]
    if onednn is not None:
        sources += [os.path.join(src_dir, f) for f in _DNNL_SOURCES]
        # -fopenmp: the conv ops set the thread count of libdnnl's OpenMP (GNU) runtime
        cflags += ["-DBASEBN_WITH_DNNL", "-fopenmp"]
        include_dirs.append(onednn.include_dir)
        ldflags += ["-fopenmp", f"-L{onednn.lib_dir}", f"-l{onednn.link}", f"-Wl,-rpath,{onednn.lib_dir}"]
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
    if onednn is not None:  # (the BN-only key is unchanged by the oneDNN support)
        h.update(repr((ldflags, onednn.root, onednn.version)).encode())
    build_dir = os.path.join(kernel_cache_root(), h.hexdigest()[:16] + ("-cuda" if with_cuda else ""))
    return KernelBuildSpec(sources, headers, include_dirs, cflags, cuda_cflags, ldflags, with_cuda, build_dir,
                           onednn, _LIB_NAME if onednn is None else _DNNL_LIB_NAME)


def _flock(f, lock):
    if fcntl is not None:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX if lock else fcntl.LOCK_UN)


def _compile(spec):
    """Compile into ``spec.build_dir`` with MegEngine's ninja build; returns the library path."""
    stale = os.path.join(spec.build_dir, "lock")
    if os.path.exists(stale):  # the caller holds the flock: nobody else is building
        os.remove(stale)
    path = custom_op_tools.build_and_load(
        spec.lib_name, spec.sources, extra_cflags=list(spec.cflags), extra_cuda_cflags=list(spec.cuda_cflags),
        extra_ldflags=list(spec.ldflags), extra_include_paths=list(spec.include_dirs),
        with_cuda=spec.with_cuda, build_dir=spec.build_dir)
    if path is None:  # megengine refuses a second build of one name in a process
        raise RuntimeError("build_and_load returned None (already built in-process)")
    return path


def _build_and_load():
    """Build (or reuse from the cache) and load the library; returns its info dict.

    With oneDNN, a failed build is recorded (``dnnl_failed.txt``) and the BN-only library is built.
    """
    with_cuda = _cuda_wanted()
    spec = kernel_build_spec(with_cuda)
    conv_error = None
    if spec.onednn is None:
        found = find_onednn()
        conv_error = (f"oneDNN not found in {_searched_onednn_roots()} (pip install onednn-cpu-gomp "
                      "onednn-devel-cpu-gomp, or set $BASEBN_ONEDNN_ROOT)" if found is None else
                      _recorded_dnnl_failure(kernel_build_spec(with_cuda, onednn=found)))
    else:
        try:
            return dict(_load_spec(spec), conv=True, onednn=spec.onednn.version, conv_error=None)
        except Exception as exc:  # noqa: BLE001 - keep the BN kernels: build them without oneDNN
            conv_error = f"the build with oneDNN {spec.onednn.version} failed: {_compiler_errors(exc)}"
            with open(os.path.join(spec.build_dir, _DNNL_FAILED), "w") as f:
                f.write(conv_error + "\n")
            spec = kernel_build_spec(with_cuda, onednn=None)
    return dict(_load_spec(spec), conv=False, onednn=None, conv_error=conv_error)


def _compiler_errors(exc):
    """The error lines of a failed build (one line), else the exception itself."""
    lines = [ln.strip() for ln in str(exc).splitlines() if "error" in ln.lower() and not ln.startswith("[")]
    return " | ".join(lines[:6]) if lines else f"{type(exc).__name__}: {exc}"


def _recorded_dnnl_failure(dnnl_spec):
    path = os.path.join(dnnl_spec.build_dir, _DNNL_FAILED)
    reason = "conv_dnnl.cpp is missing from the kernel sources"
    if os.path.exists(path):
        with open(path) as f:
            reason = f.read().strip() + f" (recorded in {path}; delete it to retry)"
    return reason


def _load_spec(spec):
    """Build (or reuse from the cache) and load the library of ``spec``; checks the ops it must hold."""
    lib_path = os.path.join(spec.build_dir, spec.lib_name + "_v0.so")
    marker = os.path.join(spec.build_dir, "built.ok")
    os.makedirs(spec.build_dir, exist_ok=True)
    # libgomp comes in with the oneDNN library and reads this once, at load. Its default (active) keeps
    # the conv ops' OpenMP threads spinning after each op, on the core MegEngine's own ops then need:
    # ResNet-20 step at 2 threads 800 -> 485 ms (benchmarks/bench_train_step.py). A user's value wins.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
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
    for op in OP_NAMES + (CONV_OP_NAMES if spec.onednn is not None else ()):
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
    """The loaded library's info dict, or None.

    Keys: ``path``, ``cuda``, ``build_dir``, ``self_sync``, ``conv`` (the oneDNN conv ops are in it),
    ``onednn`` (its version) and ``conv_error`` (why they are not).

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


def conv_kernel_available():
    """True when the oneDNN conv ops are built into the loaded kernel library."""
    lib = load_kernels(warn=False)
    return bool(lib is not None and lib.get("conv"))


def conv_kernel_error():
    """Why the oneDNN conv ops are unavailable (None when they loaded)."""
    lib = load_kernels(warn=False)
    if lib is None:
        return f"the kernel library did not build: {_state.error}"
    return lib.get("conv_error")
