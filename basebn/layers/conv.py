"""Conv2d with a fast CPU weight gradient, and the folded conv-BN op built on the same contraction.

MegEngine 1.13's CPU backward-filter kernel is ~20x slower than its forward, so on CPU the conv
runs with a detached weight and dW comes from :func:`conv_weight_grad` (numpy BLAS). On GPU the
plain MegEngine conv is used. See docs/bn_design.md.
"""
import numpy as np

import megengine as mge
import megengine.functional as F
import megengine.module as M
from megengine.autodiff import Function
from megengine.core._imperative_rt import core2
from megengine.core.ops import builtin
from megengine.functional.debug_param import get_execution_strategy
from megengine.module.qat import QATModule

__all__ = [
    "Conv2d",
    "conv2d",
    "conv_weight_grad",
    "fast_cpu_weight_grad",
    "is_conv2d",
    "on_cpu",
    "as_pair",
    "channel_scale_shape",
    "fold_weight",
    "FoldedConv2d",
    "folded_conv_supported",
]

_FAST = {"enabled": True}


def fast_cpu_weight_grad(enabled=None):
    """Query, or switch off/on, the numpy weight gradient (off for jit.trace, which cannot trace numpy)."""
    if enabled is not None:
        _FAST["enabled"] = bool(enabled)
    return _FAST["enabled"]


def is_conv2d(m):
    """A plain (float) 2-D convolution module: megengine.module.Conv2d or a subclass, not QAT/quantized."""
    return isinstance(m, M.Conv2d) and not isinstance(m, QATModule)


def on_cpu(x):
    """True when tensor ``x`` lives on a CPU ("xpux" resolves to the GPU when one is visible)."""
    return x.device.physical_name.startswith("cpu")


def as_pair(v):
    """``v`` as an (h, w) tuple: a tuple/list as is, a number twice."""
    return tuple(v) if isinstance(v, (tuple, list)) else (v, v)


def conv_weight_grad(x, dy, weight_shape, stride, padding, dilation, groups):
    """dW[o, c, i, j] = sum_{n, h, w} dy[n, o, h, w] * xpad[n, c, h*s + i*d, w*s + j*d] (numpy, float32).

    weight_shape is MegEngine's: (O, C, kh, kw), or (G, O/G, C/G, kh, kw) for grouped convs.
    """
    (sh, sw), (ph, pw), (dh, dw) = as_pair(stride), as_pair(padding), as_pair(dilation)
    out_c, in_cg, kh, kw = dy.shape[1], weight_shape[-3], weight_shape[-2], weight_shape[-1]
    ho, wo = dy.shape[2], dy.shape[3]
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw))) if (ph or pw) else x
    grad = np.empty((out_c, in_cg, kh, kw), dtype=np.float32)
    og = out_c // groups
    for g in range(groups):
        dy_g = dy[:, g * og:(g + 1) * og]
        x_g = xp[:, g * in_cg:(g + 1) * in_cg]
        for i in range(kh):
            for j in range(kw):
                window = x_g[:, :, i * dh: i * dh + sh * (ho - 1) + 1: sh, j * dw: j * dw + sw * (wo - 1) + 1: sw]
                grad[g * og:(g + 1) * og, :, i, j] = np.tensordot(dy_g, window, axes=([0, 2, 3], [0, 2, 3]))
    return grad.reshape(weight_shape)


class _WeightGradTap(Function):
    """Identity on y; its backward passes dy through and returns dW for `weight`."""

    def __init__(self, stride, padding, dilation, groups):
        super().__init__()
        self.args = (stride, padding, dilation, groups)

    def forward(self, y, x, weight):
        self.x, self.weight_shape, self.weight_dtype = x, tuple(weight.shape), weight.dtype
        return y

    def backward(self, dy):
        x = self.x.numpy().astype(np.float32, copy=False)
        grad = conv_weight_grad(x, dy.numpy().astype(np.float32, copy=False), self.weight_shape, *self.args)
        self.x = None
        return dy, None, mge.tensor(grad, dtype=self.weight_dtype, device=dy.device)


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """F.conv2d with the fast CPU weight gradient (identical values; see module docstring)."""
    if not (_FAST["enabled"] and on_cpu(x)):
        return F.conv2d(x, weight, bias, stride, padding, dilation, groups)
    y = F.conv2d(x, weight.detach(), None, stride, padding, dilation, groups)
    y = _WeightGradTap(stride, padding, dilation, groups)(y, x.detach(), weight)
    return y if bias is None else y + bias


class Conv2d(M.Conv2d):
    """megengine.module.Conv2d with the same parameters and state dict, faster to train on CPU."""

    def calc_conv(self, inp, weight, bias):
        """:func:`conv2d` for zero-padded cross-correlation, MegEngine's own conv otherwise."""
        if self.padding_mode != "zeros" or self.conv_mode != "cross_correlation":
            return super().calc_conv(inp, weight, bias)
        return conv2d(inp, weight, bias, self.stride, self.padding, self.dilation, self.groups)


# ------------------------------------------------------------------ folded conv (conv -> BN in eval)
def channel_scale_shape(weight):
    """Shape broadcasting a per-output-channel scale over a conv weight:
    (O, C, kh, kw) -> (O, 1, 1, 1); grouped (G, O/G, C/G, kh, kw) -> (G, O/G, 1, 1, 1)."""
    if weight.ndim == 5:
        return (weight.shape[0], weight.shape[1], 1, 1, 1)
    return (weight.shape[0], 1, 1, 1)


def fold_weight(weight, scale):
    """``weight * scale`` with one scale per output channel (``scale`` of shape (1, O, 1, 1) or (O,))."""
    return weight * scale.reshape(channel_scale_shape(weight))


def folded_conv_supported(conv, inp):
    """:class:`FoldedConv2d` applies: CPU fast weight gradient on, plain zero-padded cross-correlation."""
    return (fast_cpu_weight_grad() and on_cpu(inp) and getattr(conv, "padding_mode", "zeros") == "zeros"
            and str(getattr(conv, "conv_mode", "cross_correlation")).lower().endswith("cross_correlation"))


class FoldedConv2d(Function):
    """``y = conv(x, W * s) + t`` (s, t per output channel) whose backward recomputes W * s.

    Built by autodiff, conv(x, W * s) would save the folded weight (a weight-sized copy per conv)
    for its data gradient. Only x (when a weight gradient is wanted), W and s are held. Backward:
    dx by ConvolutionBackwardData with the recomputed W * s; d(W * s) by :func:`conv_weight_grad`
    (CPU only); dW = d(W * s) * s, ds = sum(d(W * s) * W) and dt = sum(dy) per channel.
    """

    def __init__(self, conv, need_dx, need_dw):
        super().__init__()
        self.args = (conv.stride, conv.padding, conv.dilation, conv.groups)
        self.compute_mode = conv.compute_mode
        self.need_dx, self.need_dw = need_dx, need_dw

    def forward(self, x, weight, scale, shift):
        stride, padding, dilation, groups = self.args
        y = F.conv2d(x, fold_weight(weight, scale), shift, stride, padding, dilation, groups,
                     compute_mode=self.compute_mode)
        self.x = x if self.need_dw else None  # only the weight gradient needs the input
        self.x_shape = tuple(x.shape)
        self.weight, self.scale = weight, scale
        return y

    def _param_grads(self, x, weight, scale, dy):
        """(dW, ds, dt) in numpy, before dx is allocated (lower backward peak)."""
        dy_np = dy.numpy().astype(np.float32, copy=False)
        dfolded = conv_weight_grad(x.numpy().astype(np.float32, copy=False), dy_np, tuple(weight.shape), *self.args)
        c = scale.shape[1]
        dscale = np.einsum("ok,ok->o", dfolded.reshape(c, -1), weight.numpy().reshape(c, -1)).reshape(1, c, 1, 1)
        dshift = dy_np.sum(axis=(0, 2, 3)).reshape(1, c, 1, 1)
        dfolded *= scale.numpy().reshape(channel_scale_shape(weight))  # now dW
        return tuple(mge.tensor(a, dtype=like.dtype, device=dy.device)
                     for a, like in ((dfolded, weight), (dscale, scale), (dshift, scale)))

    def _input_grad(self, weight, scale, dy):
        stride, padding, dilation, groups = self.args
        (sh, sw), (ph, pw), (dh, dw) = as_pair(stride), as_pair(padding), as_pair(dilation)
        op = builtin.ConvolutionBackwardData(
            stride_h=sh, stride_w=sw, pad_h=ph, pad_w=pw, dilate_h=dh, dilate_w=dw,
            strategy=get_execution_strategy(), compute_mode=self.compute_mode,
            sparse="dense" if groups == 1 else "group")
        shape = mge.tensor(np.array(self.x_shape, np.int32), device=dy.device)
        (dx,) = core2.apply(op, fold_weight(weight, scale), dy, shape)
        return dx

    def backward(self, dy):
        x, weight, scale = self.x, self.weight, self.scale
        self.x = self.weight = self.scale = None
        grads = self._param_grads(x, weight, scale, dy) if self.need_dw else None
        del x
        dx = self._input_grad(weight, scale, dy) if self.need_dx else None
        if grads is None:
            return dx, None, None, dy.sum(axis=(0, 2, 3), keepdims=True)
        return (dx,) + grads
