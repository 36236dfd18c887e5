"""What the custom-op library (:mod:`.kernel_library`) is built from, and where its build is cached.

Sources in ``basebn/ops/csrc/`` (``$BASEBN_KERNEL_DIR``); the oneDNN conv, max-pool and matmul ops
(``conv_dnnl.cpp``, ``pool_dnnl.cpp``, ``matmul_dnnl.cpp``) are compiled in when :func:`find_onednn` finds oneDNN
and no build with it failed before with the same sources, flags and compiler (:func:`recorded_onednn_failure`); the
CUDA part when a GPU and a toolkit are found (:func:`cuda_wanted`). :func:`kernel_build_spec` gives the
:class:`KernelBuildSpec`, whose ``build_dir`` under :func:`kernel_cache_root` is keyed by the hash of the sources,
headers, flags, MegEngine version, custom-op ABI and oneDNN root/version (not of this Python file). Nothing here
compiles or loads anything.
"""
import functools
import glob
import hashlib
import json
import os
import platform
import re
import shutil
import site
import subprocess
import sys
from typing import List, NamedTuple, Optional

from loguru import logger

import megengine as mge
from megengine.core.ops.custom import get_custom_op_abi_tag
from megengine.utils import custom_op_tools

from ..utils.fs import atomic_write_bytes

__all__ = [
    "KernelBuildSpec",
    "OneDNN",
    "CUDA_ARCHS",
    "find_onednn",
    "no_onednn_reason",
    "record_onednn_build_failure",
    "recorded_onednn_failure",
    "onednn_failure_key",
    "kernel_source_dir",
    "kernel_cache_root",
    "kernel_build_spec",
    "cpu_vector_cflags",
    "nvcc_supported_archs",
    "find_cuda_root",
    "cuda_wanted",
]

_ENV_CACHE = "BASEBN_KERNEL_CACHE"
_ENV_SOURCES = "BASEBN_KERNEL_DIR"
_ENV_PORTABLE = "BASEBN_KERNEL_PORTABLE"
_PACKAGE_SOURCES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc")  # basebn/ops/csrc/
_CPU_SOURCES = ("bn_ops.cpp", "bn_cpu.cpp", "bn_act_cpu.cpp", "bn_train_cpu.cpp", "bn_running_cpu.cpp")
_CUDA_SOURCES = ("bn_cuda.cu", "bn_cuda_launch.cu")  # the MegEngine glue, the standalone launchers
_CUDA_HEADERS = ("bn_cuda_launch.h", "bn_cuda_kernels.cuh")  # (hashed in CUDA builds only)
_HEADERS = ("bn_math.h", "bn_kernels.h", "bn_act_kernels.h", "bn_cpu_rows.h", "bn_act_cpu_rows.h", "strided_copy.h",
            "strided_rows.h", "queued_work.h", "thread_env.h")
_DNNL_SOURCES = ("conv_dnnl.cpp", "pool_dnnl.cpp", "matmul_dnnl.cpp")  # the conv, max-pool and matmul ops
_DNNL_HEADERS = ("dnnl_runtime.h", "conv_depthwise_cpu.h")  # (hashed in oneDNN builds only: the BN-only key stays)
_LIB_NAME = "basebn_bn"
_DNNL_LIB_NAME = "basebn_bn_dnnl"  # another name: a failed oneDNN build can be followed by the BN-only one
_DNNL_FAILED = "dnnl_failed.txt"
_ENV_ONEDNN = "BASEBN_ONEDNN_ROOT"
# -O3 and no -march: binaries for any CPU of the ISA (but see _AVX2_CFLAGS); `#pragma omp simd` lets the
# compiler reorder those float reductions to vectorise them; -fopenmp: the fused BN-activation kernels
# (bn_act_cpu.cpp) run their passes on OpenMP's thread pool (the other BN kernels use no OpenMP runtime);
# -fno-trapping-math: the kernels never read the floating-point exception flags, so the compiler may
# evaluate both arms of a select and vectorise the branchy element-wise loops (the activations'
# derivatives, the SiLU / HSwish forwards); it changes no value (no reassociation, unlike -ffast-math).
_CFLAGS = ("-O3", "-fopenmp-simd", "-fopenmp", "-fno-trapping-math", "-DNDEBUG", "-pthread")
# On an x86-64 CPU with AVX2 the library is built for it (8 floats per vector instead of SSE2's 4): the fused
# BN-activation layers' forward + backward 0.61-0.87x the time at 32 x 96 x 56 x 56 (docs/bn_design.md). The
# flags are part of the build key, so a cache shared with older CPUs holds their portable build beside this one.
# -ffp-contract=off: no fused multiply-adds the source does not write, so element-wise results keep their bits.
_AVX2_CFLAGS = ("-mavx2", "-ffp-contract=off")
_LDFLAGS = ("-pthread", "-fopenmp")
# oldest first; sm_70 (Volta) is gone from CUDA 13's nvcc, see tests/ops/test_kernels_cuda_compile.py
CUDA_ARCHS = ("70", "75", "80", "90")


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
    without oneDNN), else ``sys.prefix`` resolved through links (a venv with the pip wheels ``onednn-cpu-gomp`` and
    ``onednn-devel-cpu-gomp``), else the user site base. A root has ``include/oneapi/dnnl/dnnl.hpp``
    and ``lib/libdnnl.so*``.
    """
    env = os.environ.get(_ENV_ONEDNN)
    roots = [env] if env else [os.path.realpath(sys.prefix), site.getuserbase()]  # one cache key per venv
    for root in roots:
        found = _onednn_at(root) if root else None
        if found is not None:
            return found
    return None


def _searched_onednn_roots():
    env = os.environ.get(_ENV_ONEDNN)
    return f"${_ENV_ONEDNN}={env}" if env else f"{sys.prefix} and {site.getuserbase()}"


def no_onednn_reason(with_cuda):
    """Why :func:`kernel_build_spec` (``onednn="auto"``) leaves the conv ops out: oneDNN not found, or
    the failure recorded by :func:`record_onednn_build_failure` (or the conv source missing)."""
    found = find_onednn()
    if found is None:
        return (f"oneDNN not found in {_searched_onednn_roots()} (pip install onednn-cpu-gomp "
                f"onednn-devel-cpu-gomp, or set ${_ENV_ONEDNN})")
    spec = kernel_build_spec(with_cuda, onednn=found)
    reason = recorded_onednn_failure(spec)
    if reason is None:
        return f"one of {', '.join(_DNNL_SOURCES)} is missing from the kernel sources"
    path = os.path.join(spec.build_dir, _DNNL_FAILED)
    return (f"{reason} (recorded in {path}; retried when the compiler, the flags or the sources change, "
            f"or delete it to retry now)")


@functools.lru_cache(maxsize=8)
def _toolchain(cxx, path_env):
    """The compiler MegEngine's build runs (``cxx``, found on ``path_env``): its resolved path and the first line of
    its ``--version``, and ninja's path."""
    found = shutil.which(cxx, path=path_env)
    version = "not found"
    if found:
        found = os.path.realpath(found)
        try:
            out = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=60).stdout
            version = (out.splitlines() or ["?"])[0].strip()
        except (OSError, subprocess.SubprocessError) as exc:
            version = f"unusable: {type(exc).__name__}"
    return {"compiler": found or cxx, "compiler_version": version, "ninja": shutil.which("ninja", path=path_env)}


def onednn_failure_key(spec):
    """What a failed oneDNN build of ``spec`` depended on: the build directory's name (the hash of the sources,
    headers, flags, MegEngine and oneDNN), the flags themselves, and the toolchain ($CXX or c++, its version; ninja).
    A failure recorded under another key is stale."""
    return {"build": os.path.basename(spec.build_dir), "cflags": list(spec.cflags), "ldflags": list(spec.ldflags),
            **_toolchain(os.environ.get("CXX", "c++"), os.environ.get("PATH"))}


def record_onednn_build_failure(spec, reason):
    """Record in ``spec``'s build directory that its oneDNN build failed, with :func:`onednn_failure_key`: while the
    key holds, :func:`kernel_build_spec` gives the BN-only library. Returns False where the cache is read-only."""
    record = {"key": onednn_failure_key(spec), "reason": reason}
    try:
        atomic_write_bytes(os.path.join(spec.build_dir, _DNNL_FAILED), (json.dumps(record, indent=1) + "\n").encode())
    except OSError as exc:
        logger.debug("basebn kernels: cannot record the failed oneDNN build in {}: {}", spec.build_dir, exc)
        return False
    return True


def recorded_onednn_failure(spec):
    """The reason recorded for a failed oneDNN build of ``spec`` while its key (:func:`onednn_failure_key`) still
    holds, else None; a stale record (another key, or none) is removed where the cache is writable."""
    path = os.path.join(spec.build_dir, _DNNL_FAILED)
    try:
        with open(path) as f:
            record = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        record = None
    if isinstance(record, dict) and record.get("key") == onednn_failure_key(spec):
        return str(record.get("reason"))
    try:
        os.remove(path)
    except OSError:  # a read-only cache: ignored all the same
        pass
    return None


def kernel_source_dir():
    """Directory of the kernel sources: ``$BASEBN_KERNEL_DIR``, else ``ops/csrc/`` inside the installed package."""
    return os.environ.get(_ENV_SOURCES) or _PACKAGE_SOURCES


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


def cuda_wanted():
    """Build the CUDA part? (a GPU is visible, a toolkit is found, BASEBN_KERNEL_CUDA is not 0).

    When it says yes, MegEngine's build tools are pointed at the toolkit found (:func:`find_cuda_root`).
    """
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


def cpu_vector_cflags(cpuinfo="/proc/cpuinfo"):
    """:data:`_AVX2_CFLAGS` where this machine is x86-64 and its CPU flags (``cpuinfo``, Linux) list avx2, else ();
    ``$BASEBN_KERNEL_PORTABLE=1`` asks for the portable build anyway."""
    if os.environ.get(_ENV_PORTABLE, "") == "1" or platform.machine().lower() not in ("x86_64", "amd64"):
        return ()
    try:
        with open(cpuinfo) as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return ()
    return _AVX2_CFLAGS if "avx2" in flags else ()


def kernel_build_spec(with_cuda, cuda_archs=CUDA_ARCHS, onednn=_AUTO):
    """The :class:`KernelBuildSpec` of the library, with the CUDA part for ``cuda_archs`` if ``with_cuda``.

    ``onednn``: a :class:`OneDNN` to compile the conv ops against, None for the BN-only library, or
    ``"auto"``: :func:`find_onednn`, unless ``conv_dnnl.cpp`` is missing or a build with it failed before
    (:func:`recorded_onednn_failure`).
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
        return spec if recorded_onednn_failure(dnnl_spec) is not None else dnnl_spec
    src_dir = kernel_source_dir()
    sources = [os.path.join(src_dir, f) for f in _CPU_SOURCES]
    headers = [os.path.join(src_dir, f) for f in _HEADERS]
    cflags = list(_CFLAGS) + list(cpu_vector_cflags())
    ldflags = list(_LDFLAGS)
    include_dirs = [src_dir]
    if onednn is not None:
        # listed first, so ninja starts them first: a oneDNN they do not build against fails the build early, not
        # after the BN sources (which the BN-only library that follows compiles again)
        sources[:0] = [os.path.join(src_dir, f) for f in _DNNL_SOURCES]
        headers += [os.path.join(src_dir, f) for f in _DNNL_HEADERS]
        # -fopenmp: the conv ops set the thread count of libdnnl's OpenMP (GNU) runtime
        cflags += ["-DBASEBN_WITH_DNNL", "-fopenmp"]
        include_dirs.append(onednn.include_dir)
        ldflags += ["-fopenmp", f"-L{onednn.lib_dir}", f"-l{onednn.link}", f"-Wl,-rpath,{onednn.lib_dir}"]
    cuda_cflags = []
    if with_cuda:
        sources += [os.path.join(src_dir, f) for f in _CUDA_SOURCES]
        headers += [os.path.join(src_dir, f) for f in _CUDA_HEADERS]
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
