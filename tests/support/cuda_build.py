"""The CUDA sources compiled once for a test session: every architecture in one nvcc call per source.

:func:`build` compiles ``bn_cuda_launch.cu`` (the standalone launchers: nvcc alone, no MegEngine include path) and
``bn_cuda.cu`` (the MegEngine glue) to objects holding SASS for each of :func:`compiled_archs`, with
``-Werror all-warnings``, and links the launchers into a shared library with nvcc. nvcc compiles the host side once
and the device side once per architecture, so one call for all of them costs less than one call per architecture;
:func:`fatbin_entries` reads back which architectures an object or library holds. No GPU is needed. :func:`cache_key`
keys the build for tests/support/build_cache.py, which keeps it between runs.
"""
import functools
import os
import shutil
import struct
import subprocess
from typing import Dict, NamedTuple, Tuple

import megengine
from megengine.core.ops.custom import get_custom_op_abi_tag

from basebn.ops import kernel_build
from tests.support.build_cache import build_key, local_includes

NVCC = shutil.which("nvcc")
KERNEL_DIR = kernel_build.kernel_source_dir()
REQUESTED_ARCHS = ("70", "80", "90")  # Volta, Ampere, Hopper; CUDA 13's nvcc has no sm_70 (its oldest is sm_75)
_FATBIN_MAGIC = 0xBA55ED50
_FATBIN_KINDS = {1: "ptx", 2: "sass"}


@functools.lru_cache(maxsize=None)
def nvcc_archs():
    """The sm numbers (ints, ascending) this nvcc compiles for."""
    out = subprocess.run([NVCC, "--list-gpu-arch"], capture_output=True, text=True, check=True).stdout
    return sorted({int(tok.split("_")[-1]) for tok in out.split() if tok.startswith("compute_")})


@functools.lru_cache(maxsize=None)
def nvcc_version():
    out = subprocess.run([NVCC, "--version"], capture_output=True, text=True).stdout.strip()
    return out.splitlines()[-1] if out else "unknown"


def compiled_archs():
    """The requested architectures this nvcc supports, and its oldest one (the stand-in for a dropped sm_70)."""
    return tuple(sorted({int(a) for a in REQUESTED_ARCHS if int(a) in nvcc_archs()} | {nvcc_archs()[0]}))


def single_arch():
    """The one architecture of the single-arch builds: sm_80 where this nvcc has it, else its oldest."""
    return "80" if 80 in nvcc_archs() else str(nvcc_archs()[0])


def megengine_paths():
    """MegEngine's include and lib folders (its custom-op headers, libmegengine_shared)."""
    root = os.path.dirname(os.path.abspath(megengine.__file__))
    return os.path.join(root, "core", "include"), os.path.join(root, "core", "lib")


def custom_op_abi():
    return str(get_custom_op_abi_tag())


class Step(NamedTuple):
    """One command of the build: what ran, its exit status and its output."""

    cmd: Tuple[str, ...]
    returncode: int
    output: str

    def check(self):
        """Assert the command succeeded (its output in the message)."""
        assert self.returncode == 0, f"{' '.join(self.cmd)}\n{self.output}"


class CudaBuild(NamedTuple):
    """The session's CUDA build: the architectures, each output's path, and each step (keyed by the output's name)."""

    archs: Tuple[int, ...]
    launch_obj: str  # bn_cuda_launch.cu -> object, without MegEngine's include path
    glue_obj: str  # bn_cuda.cu -> object, with MegEngine's include path
    standalone_so: str  # the launchers' object -> shared library, linked by nvcc
    steps: Dict[str, Step]


def _run(cmd):
    res = subprocess.run(cmd, capture_output=True, text=True)
    return Step(tuple(cmd), res.returncode, res.stdout + res.stderr)


def _compile_cmd(src, obj, archs, with_megengine):
    cmd = [NVCC, "-c", os.path.join(KERNEL_DIR, src), "-o", obj, "-std=c++14", "-O3", "-DBASEBN_WITH_CUDA",
           "-I", KERNEL_DIR, *(f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs),
           "--compiler-options", "-fPIC", "-Werror", "all-warnings"]
    if with_megengine:
        cmd += [f"-D_GLIBCXX_USE_CXX11_ABI={custom_op_abi()}", "-isystem", megengine_paths()[0]]
    return cmd


def _outputs(outdir):
    return (os.path.join(outdir, "bn_cuda_launch.o"), os.path.join(outdir, "bn_cuda.o"),
            os.path.join(outdir, "libbasebn_bn_cuda.so"))


def _commands(outdir, archs):
    """The build's three commands into ``outdir``: the launchers' object, the glue's object, the launchers' library."""
    launch_obj, glue_obj, standalone_so = _outputs(outdir)
    return {"launch_obj": _compile_cmd("bn_cuda_launch.cu", launch_obj, archs, with_megengine=False),
            "glue_obj": _compile_cmd("bn_cuda.cu", glue_obj, archs, with_megengine=True),
            "standalone_so": [NVCC, "-shared", "-o", standalone_so, launch_obj]}


def build(outdir):
    """Compile and link into ``outdir`` (see the module docstring); a step that fails is recorded, not raised."""
    archs = compiled_archs()
    out = CudaBuild(archs, *_outputs(outdir), {})
    cmds = _commands(outdir, archs)
    out.steps["launch_obj"] = _run(cmds["launch_obj"])
    out.steps["glue_obj"] = _run(cmds["glue_obj"])
    if out.steps["launch_obj"].returncode == 0:
        out.steps["standalone_so"] = _run(cmds["standalone_so"])
    else:
        out.steps["standalone_so"] = Step(("nvcc", "-shared"), 1, "not linked: bn_cuda_launch.cu did not compile")
    return out


def succeeded(out):
    """Whether every step of the build ``out`` succeeded (only such a build is kept between runs)."""
    return all(step.returncode == 0 for step in out.steps.values())


def cache_key():
    """What :func:`build`'s output depends on, hashed (tests/support/build_cache.py): the two sources and the local
    headers they include; nvcc and its host compilers (path and version); the commands, with the source, MegEngine
    include and output folders as placeholders (no check reads where they lay); MegEngine's version and ABI."""
    cmds = _commands("<out>", compiled_archs())
    values = [[arg.replace(KERNEL_DIR, "<src>").replace(megengine_paths()[0], "<megengine>") for arg in cmd]
              for cmd in cmds.values()]
    sources = local_includes([os.path.join(KERNEL_DIR, name) for name in ("bn_cuda_launch.cu", "bn_cuda.cu")])
    return build_key(sources, (NVCC, "gcc", "g++"), (values, megengine.__version__, custom_op_abi()))


def fatbin_entries(path):
    """``{(kind, sm)}`` of every fat binary in the object or library ``path``: kind "sass" (an ELF cubin for the
    GPU ``sm``) or "ptx". Read from the fatbin headers (magic 0xBA55ED50; an entry's kind at offset 0, its sizes at
    4 and 8, its sm at 28), which hold even where nvcc compressed the entries."""
    with open(path, "rb") as f:
        data = f.read()
    found, start = set(), data.find(struct.pack("<I", _FATBIN_MAGIC))
    while start >= 0:
        _, version, header_size, size = struct.unpack_from("<IHHQ", data, start)
        if version == 1 and header_size == 16:
            off, end = start + header_size, start + header_size + size
            while off + 32 <= end:
                kind, _, entry_header, entry_size = struct.unpack_from("<HHIQ", data, off)
                found.add((_FATBIN_KINDS.get(kind, str(kind)), struct.unpack_from("<I", data, off + 28)[0]))
                off += entry_header + entry_size
        start = data.find(struct.pack("<I", _FATBIN_MAGIC), start + 4)
    return found

