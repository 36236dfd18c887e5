"""Raw matrix-product op (no autograd) for CPU training: ``BasebnMatMul``, oneDNN's multi-threaded sgemm.

The op (``basebn/ops/csrc/matmul_dnnl.cpp``) builds with the oneDNN conv ops into :mod:`.kernel_library`, so it is
there exactly when :func:`~.kernel_library.conv_kernel_available` says so, and ``$BASEBN_CONV_BACKEND``
(:func:`.conv_ops.conv_backend`) switches it with them. Key fact: MegEngine 1.13's CPU MatrixMul runs on one
thread, so a classifier's matmuls did not use a second core. Tensors are 2-D float32 on CPU.
"""
import functools
import math
from typing import Optional

import megengine as mge
from megengine.core._imperative_rt.core2 import apply
from megengine.core.ops import custom

from .kernel_library import wait_for_inputs

__all__ = ["matmul"]


@functools.lru_cache(maxsize=8)
def _op(trans_a, trans_b, has_bias):
    return custom.BasebnMatMul(trans_a=trans_a, trans_b=trans_b, has_bias=has_bias)


def matmul(a: mge.Tensor, b: mge.Tensor, trans_a: bool = False, trans_b: bool = False,
           bias: Optional[mge.Tensor] = None) -> mge.Tensor:
    """``op(a) @ op(b)`` (+ ``bias`` on every row), op transposing when asked.

    Args:
        a: (M, K), or (K, M) with trans_a; float32.
        b: (K, N), or (N, K) with trans_b; float32.
        trans_a: transpose a.
        trans_b: transpose b.
        bias: N values, or None.

    Returns:
        (M, N).

    Raises:
        ValueError: shapes or dtypes the op does not take.
    """
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"matmul: a and b must be 2-D, got {tuple(a.shape)} and {tuple(b.shape)}")
    if any(str(t.dtype) != "float32" for t in ((a, b) if bias is None else (a, b, bias))):
        raise ValueError("matmul: the op takes float32 tensors")
    k_a = a.shape[0] if trans_a else a.shape[1]
    k_b = b.shape[1] if trans_b else b.shape[0]
    n = b.shape[0] if trans_b else b.shape[1]
    if k_a != k_b:
        raise ValueError(f"matmul: inner sizes differ: {tuple(a.shape)}{'^T' if trans_a else ''} and "
                         f"{tuple(b.shape)}{'^T' if trans_b else ''}")
    if bias is not None and math.prod(bias.shape) != n:
        raise ValueError(f"matmul: bias has {math.prod(bias.shape)} values, the product has {n} columns")
    inputs = (a, b, b if bias is None else bias.reshape(-1))  # b: a placeholder in the unused slot
    wait_for_inputs(*inputs)  # waits for the inputs' producers when the op cannot do it itself
    (c,) = apply(_op(bool(trans_a), bool(trans_b), bias is not None), *inputs)
    return c
