"""Compile-only checks of the CUDA BN kernels for sm_70 / sm_80 / sm_90, and of their standalone part.

No GPU is needed: nvcc compiles each architecture to a real object (PTX + SASS through ptxas). The
kernels and their launchers (bn_cuda_kernels.cuh, bn_cuda_launch.cu, C API in bn_cuda_launch.h) compile
with nvcc alone, without MegEngine's include path, into the shared library benchmarks/cuda/run_harness.py
loads; the MegEngine glue (bn_cuda.cu) and the CUDA registration (bn_ops.cpp with -DBASEBN_WITH_CUDA)
are compiled and everything is linked into a shared library with --no-undefined against MegEngine and
cudart, which proves every symbol resolves. Skipped, with the reason, when nvcc is absent.

CUDA 13's nvcc no longer supports sm_70 (Volta): the sm_70 case then skips with that reason and
``test_oldest_supported_arch`` compiles for the oldest architecture this nvcc offers (sm_75).
"""
import os
import shutil
import subprocess

import pytest

from basebn.layers import kernel_build

NVCC = shutil.which("nvcc")
KERNEL_DIR = kernel_build.kernel_source_dir()
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


STANDALONE = ("bn_cuda_launch.cu", "bn_cuda_launch.h", "bn_cuda_kernels.cuh", "bn_math.h")
C_API = ("basebn_bn_cuda_stats", "basebn_bn_cuda_normalize", "basebn_bn_cuda_backward_reduce",
         "basebn_bn_cuda_backward_elemt", "basebn_bn_cuda_act_normalize", "basebn_bn_cuda_act_backward_reduce",
         "basebn_bn_cuda_act_backward_elemt")


def _nvcc_obj(src, arch, outdir, with_megengine):
    """Compile kernels/``src`` for sm_``arch`` (MegEngine's include path only ``with_megengine``)."""
    obj = os.path.join(str(outdir), f"{src}.sm{arch}.o")
    if os.path.exists(obj):
        return obj
    cmd = [
        NVCC, "-c", os.path.join(KERNEL_DIR, src), "-o", obj,
        "-std=c++14", "-O3", "-DBASEBN_WITH_CUDA", "-I", KERNEL_DIR,
        f"-gencode=arch=compute_{arch},code=sm_{arch}",
        "--compiler-options", "-fPIC", "-Werror", "all-warnings",
    ]
    if with_megengine:
        cmd += [f"-D_GLIBCXX_USE_CXX11_ABI={_abi()}", "-isystem", _mge_paths()[0]]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"nvcc failed for sm_{arch}:\n{' '.join(cmd)}\n{res.stdout}\n{res.stderr}"
    assert os.path.getsize(obj) > 0
    return obj


def _compile_cu(arch, outdir):
    """The objects of the CUDA part: the standalone launchers (no MegEngine) and the MegEngine glue."""
    return [_nvcc_obj("bn_cuda_launch.cu", arch, outdir, with_megengine=False),
            _nvcc_obj("bn_cuda.cu", arch, outdir, with_megengine=True)]


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
    """The CPU sources of the library (kernel_build's list, -DBASEBN_WITH_CUDA) + bn_cuda.cu + bn_cuda_launch.cu link
    with no undefined symbol."""
    inc, lib = _mge_paths()
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        pytest.skip(f"no C++ compiler ({cxx})")
    arch = "80" if 80 in _nvcc_archs() else str(_nvcc_archs()[0])
    objs = _compile_cu(arch, outdir)
    for src in kernel_build._CPU_SOURCES:
        obj = os.path.join(str(outdir), src + ".cuda.o")
        cmd = [
            cxx, "-c", os.path.join(KERNEL_DIR, src), "-o", obj, "-std=c++14", "-O1",
            "-fPIC", "-fopenmp-simd", "-DBASEBN_WITH_CUDA", f"-D_GLIBCXX_USE_CXX11_ABI={_abi()}",
            "-I", KERNEL_DIR, "-isystem", inc, "-Wall", "-Werror",
        ]
        res = subprocess.run(cmd, capture_output=True, text=True)
        assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stdout}\n{res.stderr}"
        objs.append(obj)
    root = kernel_build.find_cuda_root(NVCC)
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

    root = kernel_build.find_cuda_root(NVCC)
    if root is None:
        pytest.skip("CUDA toolkit root (include/cuda_runtime.h) not found")
    if shutil.which("ninja") is None:
        pytest.skip("ninja not found")
    monkeypatch.setattr(cot, "CUDA_ROOT_DIR", root)
    arch = "80" if 80 in _nvcc_archs() else str(_nvcc_archs()[0])
    spec = kernel_build.kernel_build_spec(with_cuda=True, cuda_archs=(arch,))
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


def test_standalone_part_has_no_megengine_header():
    """What the harness builds from includes nothing of MegEngine (it runs where MegEngine is absent)."""
    for name in STANDALONE:
        text = open(os.path.join(KERNEL_DIR, name)).read()
        includes = [ln for ln in text.splitlines() if ln.strip().startswith("#include")]
        assert not [ln for ln in includes if "megbrain" in ln or "megengine" in ln.lower()], (name, includes)


def test_standalone_library_builds_with_nvcc_alone(tmp_path):
    """bn_cuda_launch.cu -> a shared library with nvcc and no MegEngine include path, exporting the C API."""
    arch = "80" if 80 in _nvcc_archs() else str(_nvcc_archs()[0])
    so = str(tmp_path / "libbasebn_bn_cuda.so")
    cmd = [NVCC, "-shared", "-o", so, os.path.join(KERNEL_DIR, "bn_cuda_launch.cu"), "-std=c++14", "-O3",
           "-I", KERNEL_DIR, f"-gencode=arch=compute_{arch},code=sm_{arch}", "--compiler-options", "-fPIC",
           "-Werror", "all-warnings"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stdout}\n{res.stderr}"
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm not found: exported symbols not checked")
    syms = subprocess.run([nm, "-D", "--defined-only", so], capture_output=True, text=True, check=True).stdout
    exported = {line.split()[-1] for line in syms.splitlines() if line.strip()}
    assert set(C_API) <= exported, sorted(exported)[:20]
