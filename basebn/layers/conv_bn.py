"""Efficient Conv2d -> BatchNorm in eval / fine-tune mode, and deploy-time conv-BN fusion.

When a BN uses its running statistics (eval mode, `norm_eval` fine-tuning, validation, FrozenBN, or
MegEngine's `freeze=True`) and its input is only the output of a convolution, then

    BN(conv(x, W) + b) = conv(x, W * s) + (b - mu) * s + beta,      s = gamma / sqrt(var + eps)

(b = 0 when the conv has no bias). `enable_efficient_conv_bn_eval` computes the right-hand side,
building the folded weight on the fly each forward: the result is exactly the same function of
x, W, gamma and beta, so gradients still reach all three (fine-tuning keeps learning them), but the
conv output is no longer an input of a BN op kept alive for backward: one activation less per pair
("Tune-Mode ConvBN Blocks for Efficient Transfer Learning", Huang et al. 2023; mmcv's
`efficient_conv_bn_eval`; PyTorch inductor's pass). In training mode (batch statistics) the pair
runs exactly as before.

Built from autodiff ops, conv(x, W * s) would in turn keep the folded weight W * s for its data
gradient: one weight-sized copy per conv, which at small images or batches eats the saving. On
CPU (where basebn's conv computes the weight gradient in numpy anyway) the fused op is therefore a
custom Function (`_FoldedConvBN`) that keeps only x, W and s and recomputes W * s in backward.
Elsewhere (GPU, non-zero padding modes, `fast_cpu_weight_grad(False)` e.g. under jit.trace) the
autodiff form is used.

The switch keeps both modules where they are (same names, same state dict): the conv's `forward`
is replaced, on the instance, by one that does the fused computation when the BN uses running
statistics, and the BN's by one that then passes its input through. The link between them is a
plain object (not a Module), so it is not part of the module tree or the state dict; it survives
`copy.deepcopy` and pickling.

`fuse_conv_bn(model)` is the deploy form: a deep copy in eval mode where each pair is folded into
one conv with bias and the BN replaced by `M.Identity`.

Pairs are found by tracing the model (see `graph.find_conv_bn_pairs`).
"""
import copy
import warnings

import numpy as np

import megengine as mge
import megengine.functional as F
import megengine.module as M
from megengine.autodiff import Function
from megengine.core._imperative_rt import core2
from megengine.core.ops import builtin
from megengine.functional.debug_param import get_execution_strategy

from .conv import _on_cpu, _pair, conv_weight_grad, fast_cpu_weight_grad
from .graph import find_conv_bn_pairs, is_batchnorm2d, is_conv2d, resolve_module, set_module

__all__ = [
    "enable_efficient_conv_bn_eval",
    "disable_efficient_conv_bn_eval",
    "efficient_conv_bn_pairs",
    "fuse_conv_bn",
    "fold_conv_bn",
    "find_conv_bn_pairs",
    "bn_uses_running_stats",
]

_LINK = "_efficient_conv_bn"


def bn_uses_running_stats(bn):
    """True when `bn`'s forward normalises with its running statistics (so it can be folded)."""
    from .frozen_bn import FrozenBatchNorm2d

    if isinstance(bn, FrozenBatchNorm2d):
        return True
    if getattr(bn, "running_mean", None) is None or getattr(bn, "running_var", None) is None:
        return False
    if not getattr(bn, "track_running_stats", True):
        return False
    return (not bn.training) or bool(getattr(bn, "freeze", False))


def _scale_shift(bn, conv_bias):
    """s = gamma / sqrt(var + eps) and t = (b - mu) * s + beta, both (1, C, 1, 1), as differentiable tensors."""
    weight, bias = getattr(bn, "weight", None), getattr(bn, "bias", None)
    if getattr(bn, "freeze", False):  # MegEngine's freeze: affine used but not learned
        weight = weight.detach() if weight is not None else None
        bias = bias.detach() if bias is not None else None
    scale = (bn.running_var + bn.eps) ** -0.5
    if weight is not None:
        scale = scale * weight
    shift = -bn.running_mean if conv_bias is None else conv_bias.reshape(bn.running_mean.shape) - bn.running_mean
    shift = shift * scale
    if bias is not None:
        shift = shift + bias
    return scale, shift


def _scale_shape(weight):
    """Shape broadcasting a per-output-channel scale over a MegEngine conv weight:
    (O, C, kh, kw), or (G, O/G, C/G, kh, kw) when groups > 1."""
    if weight.ndim == 5:
        return (weight.shape[0], weight.shape[1], 1, 1, 1)
    return (weight.shape[0], 1, 1, 1)


def _tracked(*tensors):
    """True when a GradManager records any of `tensors` (i.e. some gradient will be asked of it)."""
    return core2.get_grad_key(tensors) is not None


class _FoldedConvBN(Function):
    """y = conv(x, W * s) + t, whose backward recomputes W * s instead of keeping it.

    Built by autodiff, conv(x, W * s) would save the folded weight (a weight-sized copy per conv)
    for its data gradient. Here only x (the conv input, and only when a weight gradient is wanted)
    and W, s (alive anyway) are held. Backward: dx by MegEngine's ConvolutionBackwardData with the recomputed
    W * s; dW' = d(W * s) by the numpy contraction of basebn.layers.conv (CPU only, see there);
    dW = dW' * s, ds = sum(dW' * W) per output channel, dt = sum(dy) per channel.
    """

    def __init__(self, conv, need_dx, need_dw):
        super().__init__()
        self.args = (conv.stride, conv.padding, conv.dilation, conv.groups)
        self.compute_mode = conv.compute_mode
        self.need_dx, self.need_dw = need_dx, need_dw

    @staticmethod
    def _folded(weight, scale):
        return weight * scale.reshape(_scale_shape(weight))

    def forward(self, x, weight, scale, shift):
        stride, padding, dilation, groups = self.args
        y = F.conv2d(x, self._folded(weight, scale), shift, stride, padding, dilation, groups,
                     compute_mode=self.compute_mode)
        self.x = x if self.need_dw else None  # only the weight gradient needs the input
        self.x_shape = tuple(x.shape)
        self.weight, self.scale = weight, scale
        return y

    def backward(self, dy):
        x, weight, scale = self.x, self.weight, self.scale
        self.x = self.weight = self.scale = None
        stride, padding, dilation, groups = self.args
        grads = (None, None, None)
        if self.need_dw:
            # weight-sized and per-channel work in numpy (we are on the CPU), done before dx so the
            # numpy copies of x and dy are freed before dx is allocated (lower backward peak)
            dy_np = dy.numpy().astype(np.float32, copy=False)
            dfolded = conv_weight_grad(x.numpy().astype(np.float32, copy=False), dy_np, tuple(weight.shape),
                                       *self.args)
            del x
            c = scale.shape[1]
            dscale = np.einsum("ok,ok->o", dfolded.reshape(c, -1), weight.numpy().reshape(c, -1)).reshape(1, c, 1, 1)
            dshift = dy_np.sum(axis=(0, 2, 3)).reshape(1, c, 1, 1)
            del dy_np
            dfolded *= scale.numpy().reshape(_scale_shape(weight))  # now dW

            def out(a, like):
                return mge.tensor(a, dtype=like.dtype, device=dy.device)

            grads = (out(dfolded, weight), out(dscale, scale), out(dshift, scale))
        dx = None
        if self.need_dx:
            folded = self._folded(weight, scale)
            (sh, sw), (ph, pw), (dh, dw) = _pair(stride), _pair(padding), _pair(dilation)
            op = builtin.ConvolutionBackwardData(
                stride_h=sh, stride_w=sw, pad_h=ph, pad_w=pw, dilate_h=dh, dilate_w=dw,
                strategy=get_execution_strategy(), compute_mode=self.compute_mode,
                sparse="dense" if groups == 1 else "group")
            (dx,) = core2.apply(op, folded, dy, mge.tensor(np.array(self.x_shape, np.int32), device=dy.device))
        if not self.need_dw:
            return dx, None, None, dy.sum(axis=(0, 2, 3), keepdims=True)
        return (dx,) + grads


def _recompute_ok(conv, inp):
    """The recomputing Function applies: CPU fast weight gradient on, plain zero-padded cross-correlation."""
    return (fast_cpu_weight_grad() and _on_cpu(inp) and getattr(conv, "padding_mode", "zeros") == "zeros"
            and str(getattr(conv, "conv_mode", "cross_correlation")).lower().endswith("cross_correlation"))


class _ConvBNLink:
    """Stored on both modules of a switched pair. Not a Module: invisible to the module tree and state dict.

    It also remembers where both modules sit (parent object, key): if either is replaced later
    (convert_sync_batchnorm, a FrozenBN conversion, plain setattr) or gets another instance
    forward, `active()` turns false and the survivor runs its ordinary forward, so the model stays
    correct, just not fused.
    """

    def __init__(self, conv, bn, conv_site, bn_site):
        self.conv, self.bn = conv, bn
        self.conv_site, self.bn_site = conv_site, bn_site  # (parent, key)
        self.conv_forward = conv.__dict__.get("forward")  # an instance-level forward to restore, if any
        self.bn_forward = bn.__dict__.get("forward")

    def active(self):
        for mod, (parent, key) in ((self.conv, self.conv_site), (self.bn, self.bn_site)):
            if mod.__dict__.get(_LINK) is not self or not isinstance(mod.__dict__.get("forward"), _LinkedForward):
                return False
            try:
                if resolve_module(parent, key) is not mod:
                    return False
            except (AttributeError, IndexError, KeyError, ValueError):
                return False
        return True


class _LinkedForward:
    def __init__(self, link):
        self.link = link


class _EfficientConvForward(_LinkedForward):
    """conv.forward while switched: the fused conv-BN when the BN uses running statistics."""

    def __call__(self, inp):
        conv, bn = self.link.conv, self.link.bn
        if not (bn_uses_running_stats(bn) and self.link.active()):
            orig = self.link.conv_forward
            return orig(inp) if orig is not None else type(conv).forward(conv, inp)
        scale, shift = _scale_shift(bn, conv.bias)
        need_dx, need_dw = _tracked(inp), _tracked(conv.weight, scale)
        if (need_dx or need_dw or _tracked(shift)) and _recompute_ok(conv, inp):
            return _FoldedConvBN(conv, need_dx, need_dw)(inp, conv.weight, scale, shift)
        # no gradient wanted (plain inference), or GPU / other conv modes: autodiff, which keeps the
        # folded weight (one weight-sized copy per conv) for backward
        weight = conv.weight * scale.reshape(_scale_shape(conv.weight))
        return conv.calc_conv(inp, weight, shift)


class _EfficientBNForward(_LinkedForward):
    """bn.forward while switched: identity when the conv already applied it."""

    def __call__(self, inp):
        bn = self.link.bn
        if bn_uses_running_stats(bn) and self.link.active():
            return inp
        orig = self.link.bn_forward
        return orig(inp) if orig is not None else type(bn).forward(bn, inp)


def _check_pair(model, conv_name, bn_name):
    conv, bn = resolve_module(model, conv_name), resolve_module(model, bn_name)
    if not is_conv2d(conv):
        raise TypeError(f"{conv_name!r} is {type(conv).__name__}, not a Conv2d")
    if not is_batchnorm2d(bn):
        raise TypeError(f"{bn_name!r} is {type(bn).__name__}, not a BatchNorm2d-like module")
    if bn.num_features != conv.out_channels:
        raise ValueError(f"{conv_name!r} has {conv.out_channels} output channels, {bn_name!r} {bn.num_features}")
    return conv, bn


def _site(model, name):
    parent, _, key = name.rpartition(".")
    return resolve_module(model, parent), key


def _switch(model, conv_name, bn_name):
    conv, bn = resolve_module(model, conv_name), resolve_module(model, bn_name)
    link = _ConvBNLink(conv, bn, _site(model, conv_name), _site(model, bn_name))
    for mod, fwd in ((conv, _EfficientConvForward(link)), (bn, _EfficientBNForward(link))):
        setattr(mod, _LINK, link)
        setattr(mod, "forward", fwd)


def _unswitch(mod):
    link = mod.__dict__.get(_LINK)
    if link is None:
        return
    orig = link.conv_forward if mod is link.conv else link.bn_forward
    delattr(mod, _LINK)
    if orig is not None:
        setattr(mod, "forward", orig)
    elif "forward" in mod.__dict__:
        delattr(mod, "forward")


def efficient_conv_bn_pairs(model):
    """The (conv_name, bn_name) pairs of `model` currently switched to the efficient form."""
    names = {id(m): n for n, m in model.named_modules()}
    pairs = []
    for name, mod in model.named_modules():
        link = mod.__dict__.get(_LINK)
        if link is not None and link.conv is mod and id(link.bn) in names and link.active():
            pairs.append((name, names[id(link.bn)]))
    return pairs


def _find_or_declared(model, example_input):
    """Traced pairs; if tracing fails, the model's own `conv_bn_pairs` declaration (with a warning)."""
    try:
        return find_conv_bn_pairs(model, example_input)
    except RuntimeError as e:
        declared = getattr(model, "conv_bn_pairs", None)
        if not declared:
            raise
        warnings.warn(f"tracing failed, using model.conv_bn_pairs as declared: {e}")
        return list(declared)


def enable_efficient_conv_bn_eval(model, example_input=None, pairs=None):
    """Switch every Conv2d -> BN pair of `model` whose conv output feeds only the BN, in place.

    Pairs are found by tracing `model` on `example_input` (a tensor/array or tuple of forward
    arguments; default: `model.example_input`, `model.input_shape`, or inferred from the first
    conv's in_channels). `pairs` (list of (conv_name, bn_name)) skips the trace and trusts the
    caller. If tracing fails and the model declares `conv_bn_pairs`, those are used (with a
    warning). Pairs where the conv has forward hooks or the BN forward pre-hooks (they would see
    different tensors) are left alone. Returns the switched (conv_name, bn_name) pairs.
    Calling it again re-finds the pairs; `disable_efficient_conv_bn_eval` undoes it.
    """
    disable_efficient_conv_bn_eval(model)
    if pairs is None:
        pairs = _find_or_declared(model, example_input)
    switched = []
    for conv_name, bn_name in pairs:
        conv, bn = _check_pair(model, conv_name, bn_name)
        if conv._forward_hooks or bn._forward_pre_hooks:
            warnings.warn(f"efficient conv-BN: {conv_name} -> {bn_name} left alone (module has forward hooks)")
            continue
        _switch(model, conv_name, bn_name)
        switched.append((conv_name, bn_name))
    return switched


def disable_efficient_conv_bn_eval(model):
    """Undo `enable_efficient_conv_bn_eval` on `model` (in place); returns the pairs that were switched."""
    pairs = efficient_conv_bn_pairs(model)
    for _, mod in model.named_modules():
        _unswitch(mod)
    return pairs


def fold_conv_bn(conv, bn):
    """(weight, bias) numpy arrays of the single conv equal to bn(conv(x)) with BN's running statistics."""
    scale, shift = _scale_shift(bn, conv.bias)
    weight = conv.weight * scale.reshape(_scale_shape(conv.weight))
    return weight.numpy().astype(np.float32), shift.numpy().astype(np.float32).reshape(1, -1, 1, 1)


def fuse_conv_bn(model, example_input=None, pairs=None):
    """Inference copy of `model` (deep copy, eval mode) with each conv -> BN pair folded into the conv.

    The conv gets the folded weight and a bias, the BN is replaced by `M.Identity` (its state-dict
    keys disappear; the conv gains a `bias` key where it had none). Pairs as in
    `enable_efficient_conv_bn_eval`. BNs without running statistics are left in place.
    """
    fused = copy.deepcopy(model)
    disable_efficient_conv_bn_eval(fused)
    fused.eval()
    if pairs is None:
        pairs = _find_or_declared(fused, example_input)
    from .frozen_bn import FrozenBatchNorm2d

    for conv_name, bn_name in pairs:
        conv, bn = _check_pair(fused, conv_name, bn_name)
        no_stats = bn.running_mean is None or not getattr(bn, "track_running_stats", True)
        if no_stats and not isinstance(bn, FrozenBatchNorm2d):
            continue
        weight, bias = fold_conv_bn(conv, bn)
        conv.weight = mge.Parameter(weight)
        conv.bias = mge.Parameter(bias)
        set_module(fused, bn_name, M.Identity())
    return fused
