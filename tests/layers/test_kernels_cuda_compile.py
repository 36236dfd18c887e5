"""Compile-only check of the CUDA BN kernels (basebn/kernels/bn_cuda.cu) for sm_70 / sm_80 / sm_90.

No GPU is needed: nvcc compiles each architecture to a real object (PTX + SASS through ptxas),
then the CUDA registration (bn_ops.cpp with -DBASEBN_WITH_CUDA) is compiled and everything is
linked into a shared library with --no-undefined against MegEngine and cudart, which proves
every symbol resolves. Skipped, with the reason, when nvcc is absent.

CUDA 13's nvcc no longer supports sm_70 (Volta): the sm_70 case then skips with that reason and
``test_oldest_supported_arch`` compiles for the oldest architecture this nvcc offers (sm_75).
"""
import os
import shutil
import subprocess

import pytest

from basebn.layers import bn_ops

NVCC = shutil.which("nvcc")
KERNEL_DIR = bn_ops.kernel_source_dir()
pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(NVCC is None, reason="nvcc not found on PATH: CUDA compile check skipped")]

REQUESTED_ARCHS = ("70", "80", "90")


def _mge_paths():
    import megengine

    root = os.path.dirname(os.path.abspath(megengine.__file__))
    return os.path.join(root, "core", "include"), os.path.join(root, "core", "lib")


def _abi():
    from megengine.core.ops.custom import get_custom_op_abi_tag

    return str(get_custom_op_abi_tag())


def _nvcc_archs():
    out = subprocess.run([NVCC, "--list-gpu-arch"], capture_output=True, text=True, check=True).stdout
    return sorted({int(tok.split("_")[-1]) for tok in out.split() if tok.startswith("compute_")})


def _nvcc_version():
    out = subprocess.run([NVCC, "--version"], capture_output=True, text=True).stdout.strip()
    return out.splitlines()[-1] if out else "unknown"


@pytest.fixture(scope="module")
def outdir(tmp_path_factory):
    return tmp_path_factory.mktemp("cuda_compile")


def _compile_cu(arch, outdir):
    inc, _ = _mge_paths()
    obj = os.path.join(str(outdir), f"bn_cuda_sm{arch}.o")
    if os.path.exists(obj):
        return obj
    cmd = [
        NVCC, "-c", os.path.join(KERNEL_DIR, "bn_cuda.cu"), "-o", obj,
        "-std=c++14", "-O3", "-DBASEBN_WITH_CUDA", f"-D_GLIBCXX_USE_CXX11_ABI={_abi()}",
        "-I", KERNEL_DIR, "-isystem", inc,
        f"-gencode=arch=compute_{arch},code=sm_{arch}",
        "--compiler-options", "-fPIC", "-Werror", "all-warnings",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"nvcc failed for sm_{arch}:\n{' '.join(cmd)}\n{res.stdout}\n{res.stderr}"
    assert os.path.getsize(obj) > 0
    return obj


@pytest.mark.parametrize("arch", REQUESTED_ARCHS, ids=lambda a: f"sm_{a}")
def test_compile_arch(arch, outdir):
    if int(arch) not in _nvcc_archs():
        pytest.skip(
            f"sm_{arch} is not supported by this nvcc ({_nvcc_version()}; supported: "
            f"{', '.join('sm_%d' % a for a in _nvcc_archs())}); see test_oldest_supported_arch"
        )
    _compile_cu(arch, outdir)


def test_oldest_supported_arch(outdir):
    """Stands in for sm_70 when this nvcc dropped it: the oldest arch it can build."""
    oldest = _nvcc_archs()[0]
    _compile_cu(str(oldest), outdir)


def test_cuda_registration_compiles_and_links(outdir):
    """bn_ops.cpp + bn_cpu.cpp (-DBASEBN_WITH_CUDA) + bn_cuda.cu link with no undefined symbol."""
    inc, lib = _mge_paths()
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        pytest.skip(f"no C++ compiler ({cxx})")
    arch = "80" if 80 in _nvcc_archs() else str(_nvcc_archs()[0])
    cu_obj = _compile_cu(arch, outdir)
    objs = [cu_obj]
    for src in ("bn_ops.cpp", "bn_cpu.cpp"):
        obj = os.path.join(str(outdir), src + ".cuda.o")
        cmd = [
            cxx, "-c", os.path.join(KERNEL_DIR, src), "-o", obj, "-std=c++14", "-O1",
            "-fPIC", "-fopenmp-simd", "-DBASEBN_WITH_CUDA", f"-D_GLIBCXX_USE_CXX11_ABI={_abi()}",
            "-I", KERNEL_DIR, "-isystem", inc, "-Wall", "-Werror",
        ]
        res = subprocess.run(cmd, capture_output=True, text=True)
        assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stdout}\n{res.stderr}"
        objs.append(obj)
    root = bn_ops.find_cuda_root(NVCC)
    if root is None:
        pytest.skip("CUDA toolkit root (include/cuda_runtime.h) not found: link check skipped")
    cuda_lib = os.path.join(root, "lib64")
    so = os.path.join(str(outdir), "basebn_bn_cuda_linkcheck.so")
    cmd = [cxx, "-shared", "-o", so] + objs + [
        f"-L{lib}", "-lmegengine_shared", f"-L{cuda_lib}", "-lcudart", "-pthread", "-Wl,--no-undefined",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stdout}\n{res.stderr}"


def test_megengine_cuda_build(tmp_path, monkeypatch):
    """The exact GPU-machine build path: bn_ops' CUDA build spec through MegEngine's ninja build
    (nvcc + c++, -DBASEBN_WITH_CUDA, cudart link), for one arch to keep it short. Not loaded:
    there is no GPU here."""
    from megengine.utils import custom_op_tools as cot

    root = bn_ops.find_cuda_root(NVCC)
    if root is None:
        pytest.skip("CUDA toolkit root (include/cuda_runtime.h) not found")
    if shutil.which("ninja") is None:
        pytest.skip("ninja not found")
    monkeypatch.setattr(cot, "CUDA_ROOT_DIR", root)
    arch = "80" if 80 in _nvcc_archs() else str(_nvcc_archs()[0])
    spec = bn_ops.kernel_build_spec(with_cuda=True, cuda_archs=(arch,))
    assert any(s.endswith(".cu") for s in spec.sources) and "-DBASEBN_WITH_CUDA" in spec.cflags
    assert f"-gencode=arch=compute_{arch},code=sm_{arch}" in spec.cuda_cflags
    path = cot.build(
        "basebn_bn_cudacheck",
        spec.sources,
        extra_cflags=list(spec.cflags),
        extra_cuda_cflags=list(spec.cuda_cflags),
        extra_ldflags=list(spec.ldflags) + ["-Wl,--no-undefined"],
        extra_include_paths=list(spec.include_dirs),
        with_cuda=True,
        build_dir=str(tmp_path),
    )
    assert path is not None and os.path.exists(path), path
