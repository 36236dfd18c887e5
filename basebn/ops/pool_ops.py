"""Raw max-pool ops (no autograd) for CPU training: ``BasebnMaxPoolFwd`` / ``BasebnMaxPoolBwd``.

The ops (``basebn/ops/csrc/pool_dnnl.cpp``: OpenMP loops over the N*C planes, faster here than oneDNN's
pooling) build with the oneDNN conv ops into :mod:`.kernel_library`, so they are there exactly when
:func:`~.kernel_library.conv_kernel_available` says so, and ``$BASEBN_CONV_BACKEND``
(:func:`.conv_ops.conv_backend`) switches both. Key fact: the backward takes (dy, x, y), no workspace, and
gives every element equal to its window's maximum that window's whole gradient, as MegEngine's own max-pool
gradient does (oneDNN and PyTorch pick one argmax). Tensors are NCHW float32 on CPU; padding never wins.
"""
import functools
from typing import NamedTuple, Tuple

import megengine as mge
from megengine.core._imperative_rt.core2 import apply
from megengine.core.ops import custom

from .kernel_library import wait_for_inputs

__all__ = ["PoolGeometry", "check_pool_shapes", "max_pool_forward", "max_pool_backward"]


class PoolGeometry(NamedTuple):
    """Kernel, stride and padding of a 2-D pooling as (h, w) pairs."""

    kernel: Tuple[int, int]
    stride: Tuple[int, int]
    padding: Tuple[int, int]

    def params(self):
        """The ops' params."""
        (kh, kw), (sh, sw), (ph, pw) = self.kernel, self.stride, self.padding
        return dict(kernel_h=int(kh), kernel_w=int(kw), stride_h=int(sh), stride_w=int(sw), pad_h=int(ph),
                    pad_w=int(pw))

    def output_hw(self, in_hw):
        """(HO, WO) for an input of spatial size ``in_hw``: floor((H + 2 pad - kernel) / stride) + 1."""
        return tuple((size + 2 * p - k) // s + 1 for size, k, s, p in zip(in_hw, self.kernel, self.stride,
                                                                            self.padding))


@functools.lru_cache(maxsize=256)
def _op(name, **params):
    return getattr(custom, name)(**params)


def _run(name, geom, inputs):
    wait_for_inputs(*inputs)  # waits for the inputs' producers when the ops cannot do it themselves
    (out,) = apply(_op(name, **geom.params()), *inputs)
    return out


def check_pool_shapes(x: mge.Tensor, geom: PoolGeometry) -> None:
    """Raise ValueError unless ``x`` (NCHW float32) and ``geom`` make a max pooling the ops compute.

    The ops' own checks (``custom_assert``) only log in a release build, so every case is checked here first:
    a positive kernel and stride, 0 <= padding < kernel (MegEngine's "CaffePooling" range is not theirs), and a
    window that fits the padded input.

    Args:
        x: the input.
        geom: kernel, stride and padding.

    Raises:
        ValueError: naming what does not fit.
    """
    if x.ndim != 4:
        raise ValueError(f"max_pool2d: input must be NCHW, got shape {tuple(x.shape)}")
    if str(x.dtype) != "float32":
        raise ValueError(f"max_pool2d: the ops take float32, got {x.dtype}")
    for name, pair in (("kernel", geom.kernel), ("stride", geom.stride)):
        if min(pair) < 1:
            raise ValueError(f"max_pool2d: {name} {pair} must be positive")
    for axis, size, k, p in zip(("height", "width"), x.shape[2:], geom.kernel, geom.padding):
        if not 0 <= p < k:
            raise ValueError(f"max_pool2d: {axis} padding {p} must be >= 0 and smaller than the kernel {k}")
        if size + 2 * p < k:
            raise ValueError(f"max_pool2d: input {axis} {size} (padding {p}) is smaller than the kernel {k}")


def max_pool_forward(x: mge.Tensor, geom: PoolGeometry) -> mge.Tensor:
    """y[n, c, i, j] = max of x over window (i, j) of ``geom``.

    Args:
        x: NCHW float32.
        geom: kernel, stride and padding.

    Raises:
        ValueError: as check_pool_shapes.
    """
    check_pool_shapes(x, geom)
    return _run("BasebnMaxPoolFwd", geom, (x,))


def max_pool_backward(dy: mge.Tensor, x: mge.Tensor, y: mge.Tensor, geom: PoolGeometry) -> mge.Tensor:
    """dx of ``y = max_pool_forward(x, geom)``: each window's ``dy`` to every element of it equal to its ``y``.

    Args:
        dy: the output gradient.
        x: the forward's input.
        y: the forward's output.
        geom: the forward's geometry.

    Raises:
        ValueError: shapes that do not fit x and geom.
    """
    check_pool_shapes(x, geom)
    want = tuple(x.shape[:2]) + geom.output_hw(x.shape[2:])
    for name, t in (("dy", dy), ("y", y)):
        if tuple(t.shape) != want:
            raise ValueError(f"max_pool2d backward: {name} has shape {tuple(t.shape)}, the output is {want}")
    return _run("BasebnMaxPoolBwd", geom, (dy, x, y))
