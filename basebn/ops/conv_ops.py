"""Raw oneDNN convolution ops (no autograd) and the choice of CPU conv backend.

The ops (``basebn/ops/csrc/conv_dnnl.cpp``) live in :mod:`basebn.ops.kernel_library`, built with
them when oneDNN is found (:func:`~basebn.ops.kernel_library.find_onednn`). ``$BASEBN_CONV_BACKEND``:
``dnnl`` (the ops; an error if they did not build), ``megengine`` (MegEngine's conv and the numpy
weight gradient), ``auto`` (default: the ops when built, else ``megengine`` after one warning).
Tensors are NCHW float32 on CPU; weights in MegEngine's layout, (O, C, kh, kw) or (G, O/G, C/G, kh, kw).
"""
import functools
import math
import os
from typing import NamedTuple, Optional, Sequence, Tuple

import numpy as np
from loguru import logger

import megengine as mge
from megengine.core._imperative_rt.core2 import apply
from megengine.core.ops import custom

from ..utils.env_vars import CONV_BACKENDS
from .kernel_library import KernelUnavailableError, conv_kernel_available, conv_kernel_error, wait_for_inputs

__all__ = ["CONV_BACKENDS", "ConvGeometry", "conv_backend", "check_conv_shapes", "conv_forward", "conv_backward_data",
           "conv_backward_weights", "conv_backward"]

_ENV_BACKEND = "BASEBN_CONV_BACKEND"
_warned = {"fallback": False}


def conv_backend():
    """The CPU conv path now: ``"dnnl"`` or ``"megengine"`` (see the module docstring).

    Raises ValueError for an unknown ``$BASEBN_CONV_BACKEND`` and :class:`KernelUnavailableError`
    when ``dnnl`` is forced but the ops did not build.
    """
    req = os.environ.get(_ENV_BACKEND, "auto").strip().lower() or "auto"
    if req not in CONV_BACKENDS:
        raise ValueError(f"{_ENV_BACKEND} must be one of {CONV_BACKENDS}, got {req!r}")
    if req == "megengine":
        return "megengine"
    if conv_kernel_available():
        return "dnnl"
    if req == "dnnl":
        raise KernelUnavailableError(f"{_ENV_BACKEND}=dnnl but the oneDNN conv ops are unavailable: "
                                     f"{conv_kernel_error()}")
    if not _warned["fallback"]:
        _warned["fallback"] = True
        logger.warning("basebn oneDNN conv ops unavailable, CPU convs use MegEngine's (slower): {}",
                       conv_kernel_error())
    return "megengine"


class ConvGeometry(NamedTuple):
    """Stride, padding and dilation as (h, w) pairs, and the group count."""

    stride: Tuple[int, int]
    padding: Tuple[int, int]
    dilation: Tuple[int, int]
    groups: int

    def params(self):
        """The ops' geometry params."""
        (sh, sw), (ph, pw), (dh, dw) = self.stride, self.padding, self.dilation
        return dict(stride_h=int(sh), stride_w=int(sw), pad_h=int(ph), pad_w=int(pw), dilate_h=int(dh),
                    dilate_w=int(dw), groups=int(self.groups))


@functools.lru_cache(maxsize=1024)
def _op(name, geom, **params):
    return getattr(custom, name)(**geom.params(), **params)


def _run(name, geom, inputs, **params):
    wait_for_inputs(*inputs)  # waits for the inputs' producers when the ops cannot do it themselves
    return apply(_op(name, geom, **params), *inputs)


def check_conv_shapes(x: mge.Tensor, weight: mge.Tensor, bias: Optional[mge.Tensor], geom: ConvGeometry) -> None:
    """Raise ValueError unless ``x``, ``weight`` and ``bias`` make a valid conv of ``geom``.

    The ops' own checks (``custom_assert``) only log in a release build and the op then returns garbage,
    so every shape a user can get wrong is checked here first, as MegEngine's conv does.

    Args:
        x: NCHW input.
        weight: (O, C, kh, kw), or (G, O/G, C/G, kh, kw) grouped.
        bias: O values, or None.
        geom: stride, padding, dilation and groups.

    Raises:
        ValueError: naming the shape that does not fit.
    """
    if x.ndim != 4 or weight.ndim not in (4, 5):
        raise ValueError(f"conv2d: input must be NCHW and weight (O, C, kh, kw) or (G, O/G, C/G, kh, kw); "
                         f"got input {tuple(x.shape)}, weight {tuple(weight.shape)}")
    groups = geom.groups
    out_channels = weight.shape[0] * (weight.shape[1] if weight.ndim == 5 else 1)
    in_per_group, kh, kw = weight.shape[-3:]
    if x.shape[1] != in_per_group * groups:
        raise ValueError(f"conv2d: input has {x.shape[1]} channels but the weight {tuple(weight.shape)} with "
                         f"{groups} group(s) expects {in_per_group * groups}")
    (sh, sw), (ph, pw), (dh, dw) = geom.stride, geom.padding, geom.dilation
    for size, pad, k, d, axis in ((x.shape[2], ph, kh, dh, "height"), (x.shape[3], pw, kw, dw, "width")):
        if size + 2 * pad < (k - 1) * d + 1:
            raise ValueError(f"conv2d: input {axis} {size} (padding {pad}) is smaller than the kernel's "
                             f"{(k - 1) * d + 1}")
    if bias is not None and math.prod(bias.shape) != out_channels:
        raise ValueError(f"conv2d: bias has {math.prod(bias.shape)} values, the weight {tuple(weight.shape)} has "
                         f"{out_channels} output channels")


def conv_forward(x: mge.Tensor, weight: mge.Tensor, bias: Optional[mge.Tensor], geom: ConvGeometry) -> mge.Tensor:
    """``conv(x, weight) + bias``.

    Args:
        x: NCHW input.
        weight: (O, C, kh, kw), or (G, O/G, C/G, kh, kw) grouped.
        bias: O values (any shape), or None.
        geom: stride, padding, dilation and groups.

    Raises:
        ValueError: shapes that do not make a conv (check_conv_shapes).
    """
    check_conv_shapes(x, weight, bias, geom)
    b = weight if bias is None else bias.reshape(-1)  # a placeholder fills the unused slot
    (y,) = _run("BasebnConvFwd", geom, (x, weight, b), has_bias=bias is not None)
    return y


def _check_addend(addend, shape):
    """A gradient added to dx must be float32 of dx's ``shape``."""
    if tuple(addend.shape) != tuple(shape) or addend.dtype != np.float32:
        raise ValueError(f"conv data gradient: the added gradient must be float32 {tuple(shape)}, got "
                         f"{addend.dtype} {tuple(addend.shape)}")


def conv_backward_data(dy: mge.Tensor, weight: mge.Tensor, in_hw: Sequence[int], geom: ConvGeometry,
                       addend: Optional[mge.Tensor] = None) -> mge.Tensor:
    """dx of a conv, from ``dy`` and ``weight``.

    Args:
        dy: the output gradient.
        weight: the conv's weight.
        in_hw: the input's spatial size (H, W).
        geom: the conv's geometry.
        addend: a second gradient of x, of dx's shape, added in the pass that writes dx (one op, no extra add);
            or None.
    """
    if addend is not None:
        _check_addend(addend, (dy.shape[0], weight.shape[-3] * geom.groups) + tuple(int(v) for v in in_hw))
    (dx,) = _run("BasebnConvBwdData", geom, (dy, weight, dy if addend is None else addend), in_h=int(in_hw[0]),
                 in_w=int(in_hw[1]), has_addend=addend is not None)  # dy: a placeholder in the unused slot
    return dx


def conv_backward(dy: mge.Tensor, weight: mge.Tensor, x: mge.Tensor, geom: ConvGeometry, with_bias: bool = False,
                  addend: Optional[mge.Tensor] = None) -> Tuple[mge.Tensor, mge.Tensor, Optional[mge.Tensor]]:
    """``(dx, dW, db)`` of a conv in one op call, dy reordered once for both gradients.

    Args:
        dy: the output gradient.
        weight: the conv's weight.
        x: the conv's input.
        geom: the conv's geometry.
        with_bias: also db.
        addend: added to dx, as in :func:`conv_backward_data`; or None.

    Returns:
        ``(dx, dW, db)``: dW and db as :func:`conv_backward_weights`.
    """
    if addend is not None:
        _check_addend(addend, x.shape)
    dx, dw, db = _run("BasebnConvBwd", geom, (dy, weight, x, dy if addend is None else addend),
                      in_h=int(x.shape[2]), in_w=int(x.shape[3]), has_bias=bool(with_bias),
                      has_addend=addend is not None)
    return dx, dw, (db if with_bias else None)


def conv_backward_weights(x: mge.Tensor, dy: mge.Tensor, kernel_hw: Sequence[int], geom: ConvGeometry,
                          with_bias: bool = False) -> Tuple[mge.Tensor, Optional[mge.Tensor]]:
    """The weight (and bias) gradients of a conv.

    Args:
        x: the conv's input.
        dy: the output gradient.
        kernel_hw: the kernel's (kh, kw).
        geom: the conv's geometry.
        with_bias: also db.

    Returns:
        ``(dW, db)``: dW dense (O, C, kh, kw) or grouped (G, O/G, C/G, kh, kw); db (O,) or None.
    """
    dw, db = _run("BasebnConvBwdFilter", geom, (x, dy), kernel_h=int(kernel_hw[0]), kernel_w=int(kernel_hw[1]),
                  has_bias=bool(with_bias))
    return dw, (db if with_bias else None)
