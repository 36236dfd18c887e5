"""MaxPool2d whose CPU training runs on basebn's multi-threaded max-pool ops (:mod:`basebn.ops.pool_ops`).

MegEngine 1.13's CPU max-pool backward runs on one thread (70.8 ms of a 2-thread ResNet-18 step). The ops
compute the same values and the same gradient, ties included: every element equal to its window's
maximum gets that window's whole gradient, as MegEngine's does. They run when the input is on CPU and
float32, the module is training, the oneDNN ops are built (``$BASEBN_CONV_BACKEND``, shared with the conv
ops), the fast CPU paths are on (:func:`.conv.fast_cpu_weight_grad`) and no symbolic trace is being
recorded; otherwise it is ``F.max_pool2d``, so traced and exported graphs hold a plain max pool.
"""
from typing import Optional, Sequence, Union

import megengine as mge
import megengine.functional as F
import megengine.module as M
from megengine.autodiff import Function

from .conv import as_pair, fast_cpu_weight_grad, on_cpu, records_grad
from ..ops.conv_ops import conv_backend
from ..ops.kernel_library import symbolic_tracing
from ..ops.pool_ops import PoolGeometry, check_pool_shapes, max_pool_backward, max_pool_forward

__all__ = ["MaxPool2d", "max_pool2d", "max_pool_ops_apply"]


class _MaxPool2dOps(Function):
    """max_pool2d on the ops; keeps x and y (as MegEngine's own max-pool gradient does) for the backward."""

    def __init__(self, geom):
        super().__init__()
        self.geom = geom

    def forward(self, x):
        y = max_pool_forward(x, self.geom)
        self.x, self.y = x, y
        return y

    def backward(self, dy):
        x, y = self.x, self.y
        self.x = self.y = None
        return max_pool_backward(dy, x, y, self.geom)


def _geometry(kernel_size, stride, padding):
    return PoolGeometry(as_pair(kernel_size), as_pair(kernel_size if stride is None else stride), as_pair(padding))


def max_pool_ops_apply(x: mge.Tensor, geom: PoolGeometry) -> bool:
    """Do the ops take this call? (CPU, float32 NCHW, not empty, 0 <= padding < kernel, the window fits, fast
    paths on, not in a symbolic trace, ``$BASEBN_CONV_BACKEND`` gives ``dnnl``).

    Args:
        x: the input.
        geom: the pooling window.
    """
    if not (fast_cpu_weight_grad() and not symbolic_tracing() and on_cpu(x) and conv_backend() == "dnnl"):
        return False
    try:
        check_pool_shapes(x, geom)  # the ops' own rule: what it refuses, MegEngine's pool takes
    except ValueError:
        return False
    return min(x.shape) > 0


def max_pool2d(x: mge.Tensor, kernel_size: Union[int, Sequence[int]],
               stride: Optional[Union[int, Sequence[int]]] = None,
               padding: Union[int, Sequence[int]] = 0) -> mge.Tensor:
    """``F.max_pool2d`` on the ops when :func:`max_pool_ops_apply`, else MegEngine's.

    Args:
        x: (N, C, H, W).
        kernel_size: an int or (h, w).
        stride: an int or (h, w); None: kernel_size.
        padding: an int or (h, w).
    """
    geom = _geometry(kernel_size, stride, padding)
    if not max_pool_ops_apply(x, geom):
        return F.max_pool2d(x, kernel_size, stride, padding)
    if not records_grad(x):
        return max_pool_forward(x, geom)
    return _MaxPool2dOps(geom)(x)


class MaxPool2d(M.MaxPool2d):
    """megengine.module.MaxPool2d (same constructor, attributes and state) that trains faster on CPU."""

    def forward(self, inp):
        if not self.training:
            return F.max_pool2d(inp, self.kernel_size, self.stride, self.padding)
        return max_pool2d(inp, self.kernel_size, self.stride, self.padding)
