"""Compile-only checks of the CUDA BN kernels for sm_70 / sm_80 / sm_90, and of their standalone part.

No GPU is needed: the session's ``cuda_build`` (tests/support/cuda_build.py) compiles each source once for every
architecture, to real objects (PTX + SASS through ptxas), and each architecture's check finds its SASS in the
objects' fat binaries. The kernels and their launchers (bn_cuda_kernels.cuh, bn_cuda_launch.cu, C API in
bn_cuda_launch.h) compile with nvcc alone, without MegEngine's include path, into the shared library
benchmarks/cuda/run_harness.py loads; the MegEngine glue (bn_cuda.cu) and the CUDA registration (bn_ops.cpp with
-DBASEBN_WITH_CUDA) are compiled and everything is linked into a shared library with --no-undefined against
MegEngine and cudart, which proves every symbol resolves. Skipped, with the reason, when nvcc is absent. The
session's build and the MegEngine build are kept between runs under a key of everything they are built from, as
ccache keeps objects (tests/support/build_cache.py).

CUDA 13's nvcc no longer supports sm_70 (Volta): the sm_70 case then skips with that reason and
``test_oldest_supported_arch`` checks the oldest architecture this nvcc offers (sm_75), which the build includes.
"""
import os
import shutil
import subprocess

import pytest

import megengine

from basebn.ops import kernel_build
from tests.support.build_cache import build_key, cached_build
from tests.support.cuda_build import (KERNEL_DIR, NVCC, REQUESTED_ARCHS, custom_op_abi, fatbin_entries,
                                      megengine_paths, nvcc_archs, nvcc_version, single_arch)

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(NVCC is None, reason="nvcc not found on PATH: CUDA compile check skipped")]

STANDALONE = ("bn_cuda_launch.cu", "bn_cuda_launch.h", "bn_cuda_kernels.cuh", "bn_math.h")
C_API = ("basebn_bn_cuda_stats", "basebn_bn_cuda_normalize", "basebn_bn_cuda_backward_reduce",
         "basebn_bn_cuda_backward_elemt", "basebn_bn_cuda_act_normalize", "basebn_bn_cuda_act_backward_reduce",
         "basebn_bn_cuda_act_backward_elemt")


def _compiled_objects(build, arch):
    """The launchers' and the glue's objects, each compiled with -Werror all-warnings, non-empty and holding SASS
    for sm_``arch``."""
    objs = []
    for name in ("launch_obj", "glue_obj"):
        build.steps[name].check()
        path = getattr(build, name)
        assert os.path.getsize(path) > 0, path
        entries = fatbin_entries(path)
        assert ("sass", arch) in entries, (path, sorted(entries))
        objs.append(path)
    return objs


@pytest.mark.parametrize("arch", REQUESTED_ARCHS, ids=lambda a: f"sm_{a}")
def test_compile_arch(arch, cuda_build):
    if int(arch) not in nvcc_archs():
        pytest.skip(
            f"sm_{arch} is not supported by this nvcc ({nvcc_version()}; supported: "
            f"{', '.join('sm_%d' % a for a in nvcc_archs())}); see test_oldest_supported_arch"
        )
    _compiled_objects(cuda_build, int(arch))


def test_oldest_supported_arch(cuda_build):
    """Stands in for sm_70 when this nvcc dropped it: the oldest arch it can build."""
    _compiled_objects(cuda_build, nvcc_archs()[0])


def test_cuda_registration_compiles_and_links(cuda_build, tmp_path):
    """The CPU sources of the library (kernel_build's list, -DBASEBN_WITH_CUDA) + bn_cuda.cu + bn_cuda_launch.cu link
    with no undefined symbol."""
    inc, lib = megengine_paths()
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        pytest.skip(f"no C++ compiler ({cxx})")
    objs = _compiled_objects(cuda_build, int(single_arch()))
    for src in kernel_build._CPU_SOURCES:
        obj = str(tmp_path / (src + ".cuda.o"))
        cmd = [
            cxx, "-c", os.path.join(KERNEL_DIR, src), "-o", obj, "-std=c++14", "-O1",
            "-fPIC", "-fopenmp-simd", "-DBASEBN_WITH_CUDA", f"-D_GLIBCXX_USE_CXX11_ABI={custom_op_abi()}",
            "-I", KERNEL_DIR, "-isystem", inc, "-Wall", "-Werror",
        ]
        res = subprocess.run(cmd, capture_output=True, text=True)
        assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stdout}\n{res.stderr}"
        objs.append(obj)
    root = kernel_build.find_cuda_root(NVCC)
    if root is None:
        pytest.skip("CUDA toolkit root (include/cuda_runtime.h) not found: link check skipped")
    cuda_lib = os.path.join(root, "lib64")
    so = str(tmp_path / "basebn_bn_cuda_linkcheck.so")
    cmd = [cxx, "-shared", "-o", so] + objs + [
        f"-L{lib}", "-lmegengine_shared", f"-L{cuda_lib}", "-lcudart", "-pthread", "-Wl,--no-undefined",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stdout}\n{res.stderr}"


def test_megengine_cuda_build(monkeypatch):
    """The exact GPU-machine build path: bn_ops' CUDA build spec through MegEngine's ninja build
    (nvcc + c++, -DBASEBN_WITH_CUDA, cudart link), for one arch to keep it short. Not loaded:
    there is no GPU here. The build is kept between runs while the spec's sources, headers, flags and include
    folders, MegEngine (its version, ABI and build script), the toolkit, the compilers and ninja are the same
    (tests/support/build_cache.py)."""
    from megengine.utils import custom_op_tools as cot

    root = kernel_build.find_cuda_root(NVCC)
    if root is None:
        pytest.skip("CUDA toolkit root (include/cuda_runtime.h) not found")
    if shutil.which("ninja") is None:
        pytest.skip("ninja not found")
    monkeypatch.setattr(cot, "CUDA_ROOT_DIR", root)
    arch = single_arch()
    spec = kernel_build.kernel_build_spec(with_cuda=True, cuda_archs=(arch,))
    assert any(s.endswith(".cu") for s in spec.sources) and "-DBASEBN_WITH_CUDA" in spec.cflags
    assert f"-gencode=arch=compute_{arch},code=sm_{arch}" in spec.cuda_cflags
    ldflags = list(spec.ldflags) + ["-Wl,--no-undefined"]

    def make(folder):
        return cot.build("basebn_bn_cudacheck", spec.sources, extra_cflags=list(spec.cflags),
                         extra_cuda_cflags=list(spec.cuda_cflags), extra_ldflags=ldflags,
                         extra_include_paths=list(spec.include_dirs), with_cuda=True, build_dir=folder)

    tools = (os.path.join(root, "bin", "nvcc"), os.environ.get("CXX", "c++"), "gcc", "g++", "ninja")
    key = build_key(spec.sources + spec.headers + [cot.__file__], tools,
                    (spec.cflags, spec.cuda_cflags, ldflags, spec.include_dirs, root, custom_op_abi(),
                     megengine.__version__))
    path = cached_build("megengine_cuda_build", key, make, keep=lambda p: p is not None and os.path.exists(p))
    assert path is not None and os.path.exists(path), path


def test_standalone_part_has_no_megengine_header():
    """What the harness builds from includes nothing of MegEngine (it runs where MegEngine is absent)."""
    for name in STANDALONE:
        text = open(os.path.join(KERNEL_DIR, name)).read()
        includes = [ln for ln in text.splitlines() if ln.strip().startswith("#include")]
        assert not [ln for ln in includes if "megbrain" in ln or "megengine" in ln.lower()], (name, includes)


def test_standalone_library_builds_with_nvcc_alone(cuda_build):
    """bn_cuda_launch.cu -> an object and a shared library with nvcc and no MegEngine include path (the build's
    commands name none), holding SASS for every architecture and exporting the C API."""
    so = cuda_build.standalone_so
    for name in ("launch_obj", "standalone_so"):
        step = cuda_build.steps[name]
        step.check()
        assert not [arg for arg in step.cmd if "megengine" in arg.lower()], step.cmd
    assert {("sass", arch) for arch in cuda_build.archs} <= fatbin_entries(so), sorted(fatbin_entries(so))
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm not found: exported symbols not checked")
    syms = subprocess.run([nm, "-D", "--defined-only", so], capture_output=True, text=True, check=True).stdout
    exported = {line.split()[-1] for line in syms.splitlines() if line.strip()}
    assert set(C_API) <= exported, sorted(exported)[:20]
