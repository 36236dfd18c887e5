"""Build basebn's standalone CUDA BN kernels with nvcc and call them from Python (ctypes; PyTorch tensors).

No MegEngine and no basebn import: the sources are basebn/ops/csrc/bn_cuda_launch.cu (+ bn_cuda_kernels.cuh,
bn_cuda_launch.h, bn_math.h), whose C API takes raw device pointers, shapes, strides and a cudaStream_t.
:func:`build_library` compiles them into a shared library (cudart linked statically, nvcc's default);
:class:`CudaBnKernels` wraps its four functions for torch CUDA tensors, launching on torch's current stream.
"""
import ctypes
import hashlib
import os
import shutil
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
KERNEL_DIR = os.path.join(ROOT, "basebn", "ops", "csrc")
SOURCES = ("bn_cuda_launch.cu", "bn_cuda_launch.h", "bn_cuda_kernels.cuh", "bn_math.h")
COMPILE_ONLY_ARCHS = ("75", "80", "90")  # without a GPU: what the trainer's build targets (sm_70 is gone in CUDA 13)
FLOAT32, FLOAT16 = 0, 1  # BASEBN_BN_FLOAT32 / BASEBN_BN_FLOAT16
ACT_CODES = {"identity": 0, "relu": 1, "relu6": 2, "silu": 3, "hswish": 4}  # BnAct of bn_math.h
MAX_DIMS = 5


def find_nvcc():
    """Path of nvcc ($NVCC, PATH, $CUDA_HOME/bin, /usr/local/cuda/bin), or None."""
    cands = [os.environ.get("NVCC"), shutil.which("nvcc")]
    cands += [os.path.join(os.environ[k], "bin", "nvcc") for k in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(k)]
    cands.append("/usr/local/cuda/bin/nvcc")
    return next((c for c in cands if c and os.access(c, os.X_OK)), None)


def nvcc_archs(nvcc):
    """The sm numbers (as strings, e.g. "90") this nvcc compiles for."""
    out = subprocess.run([nvcc, "--list-gpu-arch"], capture_output=True, text=True, timeout=60).stdout
    return sorted({tok.split("_")[-1] for tok in out.split() if tok.startswith("compute_")}, key=int)


def gencode_flags(archs, supported):
    """-gencode flags for ``archs``: SASS of each; an arch this nvcc does not know gets its newest PTX (JIT)."""
    flags = []
    for arch in archs:
        if arch in supported:
            flags.append(f"-gencode=arch=compute_{arch},code=sm_{arch}")
        else:
            newest = supported[-1]
            flags.append(f"-gencode=arch=compute_{newest},code=compute_{newest}")
    return sorted(set(flags))


def build_library(nvcc, archs, build_dir):
    """Compile the standalone kernels for ``archs`` into ``build_dir``; returns the .so path (reused when the
    sources and flags are unchanged). Raises RuntimeError with nvcc's output on failure."""
    flags = ["-shared", "-std=c++14", "-O3", "-I", KERNEL_DIR, "--compiler-options", "-fPIC"]
    flags += gencode_flags(list(archs), nvcc_archs(nvcc))
    h = hashlib.sha256(repr((flags, nvcc)).encode())
    for name in SOURCES:
        with open(os.path.join(KERNEL_DIR, name), "rb") as f:
            h.update(name.encode() + f.read())
    os.makedirs(build_dir, exist_ok=True)
    path = os.path.join(build_dir, f"libbasebn_bn_cuda-{h.hexdigest()[:12]}.so")
    if os.path.exists(path):
        return path
    tmp = path + ".tmp"
    cmd = [nvcc, *flags, "-o", tmp, os.path.join(KERNEL_DIR, "bn_cuda_launch.cu")]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"nvcc failed:\n{' '.join(cmd)}\n{res.stdout}{res.stderr}")
    os.replace(tmp, path)
    return path


class BnTensor(ctypes.Structure):
    """``BasebnBnTensor`` of bn_cuda_launch.h."""

    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("ndim", ctypes.c_int),
                ("shape", ctypes.c_int64 * MAX_DIMS), ("stride", ctypes.c_int64 * MAX_DIMS)]


def declare_api(lib):
    """Set the argument and result types of the C API on the ctypes library ``lib``; returns it."""
    p, t, i, d = ctypes.c_void_p, ctypes.POINTER(BnTensor), ctypes.c_int, ctypes.c_double
    lib.basebn_bn_cuda_stats.argtypes = [t, p, p, i, p]
    lib.basebn_bn_cuda_normalize.argtypes = [t, p, p, p, p, p, i, p]
    lib.basebn_bn_cuda_backward_reduce.argtypes = [t, t, p, p, p, p, i, p]
    lib.basebn_bn_cuda_backward_elemt.argtypes = [t, t, p, p, p, p, p, d, p, i, p]
    lib.basebn_bn_cuda_act_normalize.argtypes = [t, t, p, p, p, p, i, p, i, p]
    lib.basebn_bn_cuda_act_backward_reduce.argtypes = [t, t, t, p, p, p, p, i, p, p, i, p]
    lib.basebn_bn_cuda_act_backward_elemt.argtypes = [t, t, t, p, p, p, p, p, p, d, i, p, p, i, p]
    for fn in ("stats", "normalize", "backward_reduce", "backward_elemt", "act_normalize", "act_backward_reduce",
               "act_backward_elemt"):
        getattr(lib, f"basebn_bn_cuda_{fn}").restype = ctypes.c_int
    return lib


def bn_tensor(data_ptr, dtype, shape, stride):
    """A :class:`BnTensor` from a device address, FLOAT32/FLOAT16, and the shape/strides (elements)."""
    v = BnTensor()
    v.data, v.dtype, v.ndim = data_ptr, dtype, len(shape)
    for k in range(MAX_DIMS):
        v.shape[k] = shape[k] if k < len(shape) else 1
        v.stride[k] = stride[k] if k < len(shape) else 0
    return v


class CudaBnKernels:
    """The launchers on torch CUDA tensors (float32/float16 x and dy; float32 per-channel tensors): the four
    BN passes and the three fused BN -> activation (+ shortcut) passes.

    Every call launches on ``torch.cuda.current_stream()`` and raises RuntimeError on a non-zero status.
    """

    def __init__(self, so_path, torch):
        self.lib = declare_api(ctypes.CDLL(so_path))
        self.torch = torch

    def _view(self, t):
        code = {self.torch.float32: FLOAT32, self.torch.float16: FLOAT16}[t.dtype]
        return bn_tensor(t.data_ptr(), code, tuple(t.shape), tuple(t.stride()))

    def _stream(self):
        return ctypes.c_void_p(self.torch.cuda.current_stream().cuda_stream)

    @staticmethod
    def _ptr(t):
        if t is None:
            return None
        assert t.is_contiguous() and t.dtype.is_floating_point
        return ctypes.c_void_p(t.data_ptr())

    def _check(self, status, what):
        if status != 0:
            raise RuntimeError(f"{what}: CUDA error {status}")

    def _channels(self, x, n=2):
        return [self.torch.empty(x.shape[1], dtype=self.torch.float32, device=x.device) for _ in range(n)]

    def stats(self, x, force_strided=False):
        """(mean, m2) float32 (C,)."""
        mean, m2 = self._channels(x)
        vx = self._view(x)
        self._check(self.lib.basebn_bn_cuda_stats(ctypes.byref(vx), self._ptr(mean), self._ptr(m2),
                                                  int(force_strided), self._stream()), "stats")
        return mean, m2

    def normalize(self, x, mean, invstd, weight=None, bias=None, force_strided=False):
        """y, contiguous, x's dtype."""
        y = self.torch.empty(tuple(x.shape), dtype=x.dtype, device=x.device)
        vx = self._view(x)
        self._check(self.lib.basebn_bn_cuda_normalize(
            ctypes.byref(vx), self._ptr(mean), self._ptr(invstd), self._ptr(weight), self._ptr(bias),
            self._ptr(y), int(force_strided), self._stream()), "normalize")
        return y

    def backward_reduce(self, dy, x, mean, invstd, force_strided=False):
        """(sum_dy, sum_dy_xhat) float32 (C,)."""
        s1, s2 = self._channels(x)
        vg, vx = self._view(dy), self._view(x)
        self._check(self.lib.basebn_bn_cuda_backward_reduce(
            ctypes.byref(vg), ctypes.byref(vx), self._ptr(mean), self._ptr(invstd), self._ptr(s1), self._ptr(s2),
            int(force_strided), self._stream()), "backward_reduce")
        return s1, s2

    def backward_elemt(self, dy, x, mean, invstd, weight, sum_dy, sum_dy_xhat, count, force_strided=False):
        """dx, contiguous, x's dtype; ``count`` is the global per-channel count."""
        dx = self.torch.empty(tuple(x.shape), dtype=x.dtype, device=x.device)
        vg, vx = self._view(dy), self._view(x)
        self._check(self.lib.basebn_bn_cuda_backward_elemt(
            ctypes.byref(vg), ctypes.byref(vx), self._ptr(mean), self._ptr(invstd), self._ptr(weight),
            self._ptr(sum_dy), self._ptr(sum_dy_xhat), float(count), self._ptr(dx), int(force_strided),
            self._stream()), "backward_elemt")
        return dx

    def _opt_view(self, t):
        return None if t is None else ctypes.byref(self._view(t))

    def act_normalize(self, x, mean, invstd, weight, bias, act, shortcut=None, force_strided=False):
        """y = act(normalize(x) [+ shortcut]), contiguous, x's dtype; ``act`` a name of ACT_CODES."""
        y = self.torch.empty(tuple(x.shape), dtype=x.dtype, device=x.device)
        vx = self._view(x)
        self._check(self.lib.basebn_bn_cuda_act_normalize(
            ctypes.byref(vx), self._opt_view(shortcut), self._ptr(mean), self._ptr(invstd), self._ptr(weight),
            self._ptr(bias), ACT_CODES[act], self._ptr(y), int(force_strided), self._stream()), "act_normalize")
        return y

    def act_backward_reduce(self, dy, y, x, mean, invstd, weight, bias, act, force_strided=False):
        """(sum_dz, sum_dz_xhat) float32 (C,), dz = act'(pre) * dy."""
        s1, s2 = self._channels(x)
        vg, vx = self._view(dy), self._view(x)
        self._check(self.lib.basebn_bn_cuda_act_backward_reduce(
            ctypes.byref(vg), self._opt_view(y), ctypes.byref(vx), self._ptr(mean), self._ptr(invstd),
            self._ptr(weight), self._ptr(bias), ACT_CODES[act], self._ptr(s1), self._ptr(s2), int(force_strided),
            self._stream()), "act_backward_reduce")
        return s1, s2

    def act_backward_elemt(self, dy, y, x, mean, invstd, weight, bias, sum_dz, sum_dz_xhat, count, act,
                           with_shortcut=False, force_strided=False):
        """(dx, dshortcut or None), contiguous, x's dtype; dshortcut = dz."""
        dx = self.torch.empty(tuple(x.shape), dtype=x.dtype, device=x.device)
        ds = self.torch.empty_like(dx) if with_shortcut else None
        vg, vx = self._view(dy), self._view(x)
        self._check(self.lib.basebn_bn_cuda_act_backward_elemt(
            ctypes.byref(vg), self._opt_view(y), ctypes.byref(vx), self._ptr(mean), self._ptr(invstd),
            self._ptr(weight), self._ptr(bias), self._ptr(sum_dz), self._ptr(sum_dz_xhat), float(count),
            ACT_CODES[act], self._ptr(dx), self._ptr(ds), int(force_strided), self._stream()), "act_backward_elemt")
        return dx, ds
