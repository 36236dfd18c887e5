"""Conv2d with fast CPU training, and the folded conv-BN op built on the same ops.

MegEngine 1.13's CPU convolutions are slow (its weight gradient ~20x its forward), so on CPU
forward, data gradient and weight gradient run on basebn's oneDNN custom ops (:mod:`basebn.ops.conv_ops`,
``$BASEBN_CONV_BACKEND``). Without them (or with ``megengine``) the conv is MegEngine's with a
detached weight and dW from :func:`conv_weight_grad` (numpy BLAS), or MegEngine's own for grouped convs. On GPU, and whenever
``fast_cpu_weight_grad(False)`` (jit.trace, exporters: a traced graph never holds a custom op),
every conv is a plain ``F.conv2d``. See docs/bn_design.md and docs/conv_backends.md.
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

from ..ops.conv_ops import (ConvGeometry, conv_backend, conv_backward, conv_backward_data, conv_backward_weights,
                           conv_forward)
from ..ops.kernel_library import has_values

__all__ = [
    "Conv2d",
    "conv2d",
    "conv_and_identity",
    "conv_weight_grad",
    "fast_cpu_weight_grad",
    "is_conv2d",
    "on_cpu",
    "as_pair",
    "channel_scale_shape",
    "fold_weight",
    "FoldedConv2d",
    "folded_conv_supported",
    "records_grad",
]

_FAST = {"enabled": True}


def fast_cpu_weight_grad(enabled=None):
    """Query, or switch off/on, the fast CPU conv paths (oneDNN ops, numpy weight gradient).

    Off, every conv is a plain ``F.conv2d``: jit.trace and the exporters need that.
    """
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

    weight_shape is MegEngine's: (O, C, kh, kw), or (G, O/G, C/G, kh, kw) for grouped convs. One
    batched matmul over the groups per kernel tap (no loop over groups: depthwise convs have hundreds).
    """
    (sh, sw), (ph, pw), (dh, dw) = as_pair(stride), as_pair(padding), as_pair(dilation)
    n, out_c, ho, wo = dy.shape
    in_cg, kh, kw = weight_shape[-3], weight_shape[-2], weight_shape[-1]
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw))) if (ph or pw) else x
    og = out_c // groups
    dy_g = dy.reshape(n, groups, og, ho * wo).transpose(1, 2, 0, 3).reshape(groups, og, n * ho * wo)
    grad = np.empty((groups, og, in_cg, kh, kw), dtype=np.float32)
    for i in range(kh):
        for j in range(kw):
            window = xp[:, :, i * dh: i * dh + sh * (ho - 1) + 1: sh, j * dw: j * dw + sw * (wo - 1) + 1: sw]
            window = window.reshape(n, groups, in_cg, ho, wo).transpose(1, 0, 3, 4, 2).reshape(groups, -1, in_cg)
            grad[:, :, :, i, j] = np.matmul(dy_g, window)
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


def records_grad(*tensors):
    """True when a GradManager records any of ``tensors`` (some gradient will be asked of it): a custom
    Function then computes only the gradients that are wanted."""
    return core2.get_grad_key(tensors) is not None


def _dnnl_applies(x, *others):
    """Run this CPU conv on the oneDNN ops? (backend ``dnnl``, float32 NCHW, not empty)."""
    return (x.ndim == 4 and has_values(x) and all(t.dtype == np.float32 for t in (x,) + others if t is not None)
            and conv_backend() == "dnnl")


def _shaped(t, shape):
    """``t`` reshaped to ``shape``; ``t`` itself when it has that shape (a reshape is a dispatched op even then)."""
    return t if tuple(t.shape) == tuple(shape) else t.reshape(shape)


class _DnnlConv2d(Function):
    """conv2d on the oneDNN ops; backward computes only the gradients that are recorded. With ``pass_input``
    the forward returns ``(y, x)``: x again, whose gradient the backward adds to dx inside the data-gradient op."""

    def __init__(self, geom, need_dx, need_dw, need_db, pass_input=False):
        super().__init__()
        self.geom, self.need_dx, self.need_dw, self.need_db = geom, need_dx, need_dw, need_db
        self.pass_input = pass_input

    def forward(self, x, weight, bias=None):
        self.x = x if self.need_dw else None  # only the weight gradient needs the input
        self.in_hw, self.weight = tuple(x.shape[2:]), weight
        self.bias_shape = None if bias is None else tuple(bias.shape)
        y = conv_forward(x, weight, bias, self.geom)
        return (y, x) if self.pass_input else y

    def backward(self, dy, dx_passed=None):
        x, weight, geom = self.x, self.weight, self.geom
        self.x = self.weight = None
        if dy is None:  # only the passed-through x was used
            return (dx_passed, None) if self.bias_shape is None else (dx_passed, None, None)
        dx = dw = db = None
        if self.need_dx and self.need_dw:  # one op call: dy reordered once for both
            dx, dw, db = conv_backward(dy, weight, x, geom, with_bias=self.need_db, addend=dx_passed)
            dw = _shaped(dw, weight.shape)
        elif self.need_dw:
            dw, db = conv_backward_weights(x, dy, weight.shape[-2:], geom, with_bias=self.need_db)
            dw = _shaped(dw, weight.shape)
        else:
            dx = conv_backward_data(dy, weight, self.in_hw, geom, addend=dx_passed) if self.need_dx else None
            db = dy.sum(axis=(0, 2, 3)) if self.need_db else None
        if self.bias_shape is None:
            return dx, dw
        return dx, dw, (None if db is None else _shaped(db, self.bias_shape))


def _dnnl_conv2d(x, weight, bias, stride, padding, dilation, groups, pass_input=False):
    """The conv on the oneDNN ops (:class:`_DnnlConv2d` when a gradient is recorded; ``pass_input``: see there)."""
    geom = ConvGeometry(as_pair(stride), as_pair(padding), as_pair(dilation), groups)
    need = (records_grad(x), records_grad(weight), bias is not None and records_grad(bias))
    if not any(need):
        return conv_forward(x, weight, bias, geom)
    fn = _DnnlConv2d(geom, *need, pass_input=pass_input)
    return fn(x, weight) if bias is None else fn(x, weight, bias)


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """F.conv2d, fast to train on CPU (oneDNN ops, else the numpy weight gradient; see module docstring)."""
    if not (_FAST["enabled"] and on_cpu(x)):
        return F.conv2d(x, weight, bias, stride, padding, dilation, groups)
    if _dnnl_applies(x, weight, bias):
        return _dnnl_conv2d(x, weight, bias, stride, padding, dilation, groups)
    if groups > 1:  # MegEngine's grouped/depthwise weight gradient beats the numpy one
        return F.conv2d(x, weight, bias, stride, padding, dilation, groups)
    y = F.conv2d(x, weight.detach(), None, stride, padding, dilation, groups)
    y = _WeightGradTap(stride, padding, dilation, groups)(y, x.detach(), weight)
    return y if bias is None else y + bias


class Conv2d(M.Conv2d):
    """megengine.module.Conv2d with the same parameters and state dict, faster to train on CPU."""

    def _plain_cross_correlation(self):
        """Zero-padded cross-correlation: what :func:`conv2d` computes."""
        return self.padding_mode == "zeros" and self.conv_mode == "cross_correlation"

    def calc_conv(self, inp, weight, bias):
        """:func:`conv2d` for zero-padded cross-correlation, MegEngine's own conv otherwise."""
        if not self._plain_cross_correlation():
            return super().calc_conv(inp, weight, bias)
        return conv2d(inp, weight, bias, self.stride, self.padding, self.dilation, self.groups)


def _passes_input(conv, x):
    """:func:`conv_and_identity` can hand x's second gradient to ``conv``'s data-gradient op: a plain basebn Conv2d
    (no hooks, no instance-level ``forward`` such as efficient conv-BN's) on the oneDNN path, x recorded."""
    return (type(conv) is Conv2d and not conv._forward_pre_hooks and not conv._forward_hooks
            and "forward" not in conv.__dict__ and conv._plain_cross_correlation()
            and _FAST["enabled"] and on_cpu(x) and _dnnl_applies(x, conv.weight, conv.bias) and records_grad(x))


def conv_and_identity(conv, x):
    """``(conv(x), x)``: a residual block's first conv and its identity shortcut, from one input.

    Autodiff would sum x's two gradients (through the conv, through the shortcut) with an extra element-wise add
    on MegEngine's one thread. For a basebn :class:`Conv2d` on the oneDNN path, without hooks, the conv's
    data-gradient op adds the shortcut's gradient in the pass that writes dx instead (on the conv's threads).
    Any other ``conv`` (a folded or QAT conv, GPU, ``jit.trace``) is simply called.
    """
    if not _passes_input(conv, x):
        return conv(x), x
    return _dnnl_conv2d(x, conv.weight, conv.bias, conv.stride, conv.padding, conv.dilation, conv.groups,
                        pass_input=True)


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
    dx from the recomputed W * s; d(W * s) and dt = sum(dy) per channel from the weight-gradient
    op; dW = d(W * s) * s, ds = sum(d(W * s) * W). CPU only: on the oneDNN ops, else MegEngine's
    ConvolutionBackwardData and :func:`conv_weight_grad` (numpy).
    """

    def __init__(self, conv, need_dx, need_dw):
        super().__init__()
        self.args = (conv.stride, conv.padding, conv.dilation, conv.groups)
        self.compute_mode = conv.compute_mode
        self.need_dx, self.need_dw = need_dx, need_dw

    def forward(self, x, weight, scale, shift):
        stride, padding, dilation, groups = self.args
        self.geom = None
        if _dnnl_applies(x, weight, scale, shift):
            self.geom = ConvGeometry(as_pair(stride), as_pair(padding), as_pair(dilation), groups)
            y = conv_forward(x, fold_weight(weight, scale), shift, self.geom)
        else:
            y = F.conv2d(x, fold_weight(weight, scale), shift, stride, padding, dilation, groups,
                         compute_mode=self.compute_mode)
        self.x = x if self.need_dw else None  # only the weight gradient needs the input
        self.x_shape = tuple(x.shape)
        self.weight, self.scale = weight, scale
        return y

    def _dnnl_param_grads(self, x, weight, scale, dy):
        """(dW, ds, dt) on the oneDNN weight-gradient op."""
        dfolded, dshift = conv_backward_weights(x, dy, weight.shape[-2:], self.geom, with_bias=True)
        dfolded = dfolded.reshape(weight.shape)
        c = scale.shape[1]
        dscale = (dfolded * weight).reshape(c, -1).sum(axis=1).reshape(1, c, 1, 1)
        return dfolded * scale.reshape(channel_scale_shape(weight)), dscale, dshift.reshape(1, c, 1, 1)

    def _param_grads(self, x, weight, scale, dy):
        """(dW, ds, dt), before dx is allocated (lower backward peak); numpy without the oneDNN ops."""
        if self.geom is not None:
            return self._dnnl_param_grads(x, weight, scale, dy)
        dy_np = dy.numpy().astype(np.float32, copy=False)
        dfolded = conv_weight_grad(x.numpy().astype(np.float32, copy=False), dy_np, tuple(weight.shape), *self.args)
        c = scale.shape[1]
        dscale = np.einsum("ok,ok->o", dfolded.reshape(c, -1), weight.numpy().reshape(c, -1)).reshape(1, c, 1, 1)
        dshift = dy_np.sum(axis=(0, 2, 3)).reshape(1, c, 1, 1)
        dfolded *= scale.numpy().reshape(channel_scale_shape(weight))  # now dW
        return tuple(mge.tensor(a, dtype=like.dtype, device=dy.device)
                     for a, like in ((dfolded, weight), (dscale, scale), (dshift, scale)))

    def _input_grad(self, weight, scale, dy):
        if self.geom is not None:
            return conv_backward_data(dy, fold_weight(weight, scale), self.x_shape[2:], self.geom)
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
