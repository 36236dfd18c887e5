"""Raw BatchNorm ops (no autograd): statistics, normalisation and the two backward passes.

Two interchangeable paths with the same numerics: C++/CUDA custom ops compiled on first use
(:mod:`.build`, :mod:`.kernel`) and pure MegEngine (:mod:`.fallback`); :mod:`.backend` picks one
(``$BASEBN_BN_BACKEND``), :mod:`.ops` dispatches. ``x``/``dy`` are (N, C, *) with 2 to 5 dims,
float32 or float16; per-channel tensors are float32 (C,). Environment: ``BASEBN_KERNEL_CACHE``,
``BASEBN_KERNEL_DIR``, ``BASEBN_NUM_THREADS`` (CPU kernel threads), ``BASEBN_KERNEL_CUDA=0``,
``BASEBN_ONEDNN_ROOT``. The same library holds the oneDNN conv ops when oneDNN is found (see
:mod:`basebn.layers.conv_ops`).
"""
from .backend import backend, use_backend
from .build import (
    CUDA_ARCHS,
    KernelBuildSpec,
    KernelUnavailableError,
    conv_kernel_available,
    conv_kernel_error,
    find_cuda_root,
    find_onednn,
    kernel_available,
    kernel_build_spec,
    kernel_cache_root,
    kernel_error,
    kernel_library,
    kernel_source_dir,
    nvcc_supported_archs,
)
from .ops import bn_backward_elemt, bn_backward_reduce, bn_normalize, bn_stats, channel_count

__all__ = [
    "bn_stats",
    "bn_normalize",
    "bn_backward_reduce",
    "bn_backward_elemt",
    "channel_count",
    "backend",
    "use_backend",
    "kernel_available",
    "kernel_error",
    "kernel_library",
    "conv_kernel_available",
    "conv_kernel_error",
    "find_onednn",
    "KernelUnavailableError",
    "KernelBuildSpec",
    "kernel_build_spec",
    "kernel_source_dir",
    "kernel_cache_root",
    "find_cuda_root",
    "nvcc_supported_archs",
    "CUDA_ARCHS",
]
