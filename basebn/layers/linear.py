"""Linear whose CPU training runs on basebn's multi-threaded matmul op (:mod:`basebn.ops.matmul_ops`).

MegEngine 1.13's CPU MatrixMul runs on one thread: a classifier's forward and backward (MobileNetV2's 1280 -> 1000
at batch 32) took 16.2 ms at 1 thread and 18.0 at 2, PyTorch's 6.3 and 5.0, basebn's op 6.9 and 6.3
(benchmarks/bench_linear.py). On the op: y = x W^T + b, dx = dy W, dW = dy^T x (oneDNN's sgemm), db = sum of dy
over the rows. It runs when the input is on CPU and float32, the module is training, the layer has at least
:data:`LINEAR_OP_MIN_MACS` multiply-adds, the oneDNN ops are built (``$BASEBN_CONV_BACKEND``, shared with the conv
ops), the fast CPU paths are on (:func:`.conv.fast_cpu_weight_grad`), autocast is off and no symbolic trace is
being recorded; otherwise it is ``F.linear``, so evaluation, traced and exported graphs hold MegEngine's MatrixMul.
"""
import math
from typing import Optional

import numpy as np

import megengine as mge
import megengine.module as M
from megengine.autodiff import Function
from megengine.core.tensor import amp

from .conv import fast_cpu_weight_grad, on_cpu, records_grad
from ..ops.conv_ops import conv_backend
from ..ops.kernel_library import symbolic_tracing
from ..ops.matmul_ops import matmul

__all__ = ["Linear", "linear", "linear_op_applies", "LINEAR_OP_MIN_MACS"]

# below this many multiply-adds (rows x in x out) the op's fixed cost (~0.1 ms a call, three calls) exceeds
# MegEngine's one-thread matmul: ResNet-20's 128 x 64 -> 10 classifier takes 0.49 ms on the op, 0.27 on MegEngine's
# (results/linear.json)
LINEAR_OP_MIN_MACS = 1 << 20
"""Multiply-adds below which Linear runs MegEngine's matmul rather than the op."""


class _LinearOp(Function):
    """``x W^T + b`` on the op, x 2-D; the backward computes only the gradients that are recorded."""

    def __init__(self, need_dx, need_dw, need_db):
        super().__init__()
        self.need_dx, self.need_dw, self.need_db = need_dx, need_dw, need_db

    def forward(self, x, weight, bias=None):
        self.x = x if self.need_dw else None  # only the weight gradient needs the input
        self.weight = weight if self.need_dx else None
        self.has_bias = bias is not None
        return matmul(x, weight, trans_b=True, bias=bias)

    def backward(self, dy):
        x, weight = self.x, self.weight
        self.x = self.weight = None
        dx = matmul(dy, weight) if self.need_dx else None
        dw = matmul(dy, x, trans_a=True) if self.need_dw else None
        if not self.has_bias:
            return dx, dw
        return dx, dw, (dy.sum(axis=0) if self.need_db else None)


def linear_op_applies(x: mge.Tensor, weight: mge.Tensor, bias: Optional[mge.Tensor] = None,
                      compute_mode: str = "default") -> bool:
    """Does the op take this call? (CPU, float32, at least :data:`LINEAR_OP_MIN_MACS` >= 1 multiply-adds, the default
    compute mode, no autocast, fast paths on, not in a symbolic trace, ``$BASEBN_CONV_BACKEND`` gives ``dnnl``).

    Args:
        x: (..., in).
        weight: (out, in).
        bias: (out,), or None.
        compute_mode: F.linear's compute mode.
    """
    tensors = (x, weight) if bias is None else (x, weight, bias)
    return (compute_mode == "default" and not amp._enabled and fast_cpu_weight_grad() and not symbolic_tracing()
            and on_cpu(x) and x.ndim >= 1 and weight.ndim == 2
            and math.prod(x.shape) * weight.shape[0] >= LINEAR_OP_MIN_MACS
            and all(t.dtype == np.float32 for t in tensors) and conv_backend() == "dnnl")


def linear(x: mge.Tensor, weight: mge.Tensor, bias: Optional[mge.Tensor] = None) -> mge.Tensor:
    """``F.linear`` on the op; callers check :func:`linear_op_applies` first.

    Args:
        x: (..., in).
        weight: (out, in).
        bias: (out,), or None.

    Returns:
        (..., out).
    """
    lead = tuple(x.shape[:-1])
    x2 = x.reshape(-1, x.shape[-1]) if x.ndim != 2 else x
    need = (records_grad(x2), records_grad(weight), bias is not None and records_grad(bias))
    if not any(need):
        y = matmul(x2, weight, trans_b=True, bias=bias)
    else:
        fn = _LinearOp(*need)
        y = fn(x2, weight) if bias is None else fn(x2, weight, bias)
    return y if x.ndim == 2 else y.reshape(lead + (weight.shape[0],))


class Linear(M.Linear):
    """megengine.module.Linear (same constructor, parameters and state dict) that trains faster on CPU."""

    def calc_linear(self, x, weight, bias):
        """:func:`linear` in training when :func:`linear_op_applies`, else MegEngine's."""
        if self.training and linear_op_applies(x, weight, bias, self.compute_mode):
            return linear(x, weight, bias)
        return super().calc_linear(x, weight, bias)
