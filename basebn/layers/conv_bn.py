"""Efficient Conv2d -> BN while the BN uses running statistics, and deploy-time conv-BN fusion.

``BN(conv(x, W) + b) = conv(x, W * s) + (b - mu) * s + beta`` with ``s = gamma / sqrt(var + eps)``.
:func:`enable_efficient_conv_bn_eval` makes each traced pair compute the right-hand side (same
gradients for x, W, gamma, beta; one activation less kept per pair) whenever the BN uses its
running statistics; in batch-statistics mode the pair runs as before. Both modules stay in place
(same names and state dict): their instance ``forward`` is swapped and linked by a plain object.
:func:`fuse_conv_bn` is the deploy form. Design notes: docs/bn_design.md.
"""
import copy
import warnings
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

import megengine as mge
import megengine.module as M

from .activation import PassThrough
from .bn_act import carry_act
from .conv import FoldedConv2d, fold_weight, folded_conv_supported, is_conv2d, records_grad
from .conv_bn_pairs import find_conv_bn_pairs
from .module_tree import find_module, get_module, parent_and_key, set_module
from .norm import has_running_stats, is_bn2d, is_frozen_bn, uses_running_stats

__all__ = [
    "enable_efficient_conv_bn_eval",
    "disable_efficient_conv_bn_eval",
    "efficient_conv_bn_pairs",
    "fuse_conv_bn",
    "fold_conv_bn",
    "find_conv_bn_pairs",
]

_LINK = "_efficient_conv_bn"


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


class _ConvBNLink:
    """Stored on both modules of a switched pair. Not a Module: invisible to the module tree and state dict.

    It also remembers where both modules sit (parent object, key): if either is replaced later
    (a conversion, plain setattr) or gets another instance forward, `active()` turns false and
    the survivor runs its ordinary forward, so the model stays correct, just not fused.
    """

    def __init__(self, conv, bn, conv_site, bn_site):
        self.conv, self.bn = conv, bn
        self.conv_site, self.bn_site = conv_site, bn_site  # (parent, key)
        self.conv_forward = conv.__dict__.get("forward")  # an instance-level forward to restore, if any
        self.bn_forward = bn.__dict__.get("forward")

    def active(self):
        """Both modules still sit where they were switched, with their linked forwards."""
        for mod, (parent, key) in ((self.conv, self.conv_site), (self.bn, self.bn_site)):
            if mod.__dict__.get(_LINK) is not self or not isinstance(mod.__dict__.get("forward"), _LinkedForward):
                return False
            if find_module(parent, key) is not mod:
                return False
        return True


class _LinkedForward:
    def __init__(self, link):
        self.link = link


class _EfficientConvForward(_LinkedForward):
    """conv.forward while switched: the fused conv-BN when the BN uses running statistics."""

    def __call__(self, inp):
        conv, bn = self.link.conv, self.link.bn
        if not (uses_running_stats(bn) and self.link.active()):
            orig = self.link.conv_forward
            return orig(inp) if orig is not None else type(conv).forward(conv, inp)
        scale, shift = _scale_shift(bn, conv.bias)
        need_dx, need_dw = records_grad(inp), records_grad(conv.weight, scale)
        if (need_dx or need_dw or records_grad(shift)) and folded_conv_supported(conv, inp):
            return FoldedConv2d(conv, need_dx, need_dw)(inp, conv.weight, scale, shift)
        # no gradient wanted (plain inference), or GPU / other conv modes: autodiff, which keeps the
        # folded weight (one weight-sized copy per conv) for backward
        return conv.calc_conv(inp, fold_weight(conv.weight, scale), shift)


class _EfficientBNForward(_LinkedForward):
    """bn.forward while switched: identity when the conv already applied it (a BN with an activation,
    :mod:`.bn_act`, still applies that: its ``post_norm``)."""

    def __call__(self, inp, *rest):
        bn = self.link.bn
        if uses_running_stats(bn) and self.link.active():
            post_norm = getattr(bn, "post_norm", None)
            return inp if post_norm is None else post_norm(inp, *rest)
        orig = self.link.bn_forward
        return orig(inp, *rest) if orig is not None else type(bn).forward(bn, inp, *rest)


def _check_pair(model, conv_name, bn_name):
    conv, bn = get_module(model, conv_name), get_module(model, bn_name)
    if not is_conv2d(conv):
        raise TypeError(f"{conv_name!r} is {type(conv).__name__}, not a Conv2d")
    if not is_bn2d(bn):
        raise TypeError(f"{bn_name!r} is {type(bn).__name__}, not a BatchNorm2d-like module")
    if bn.num_features != conv.out_channels:
        raise ValueError(f"{conv_name!r} has {conv.out_channels} output channels, {bn_name!r} {bn.num_features}")
    return conv, bn


def _switch(model, conv_name, bn_name):
    conv, bn = get_module(model, conv_name), get_module(model, bn_name)
    link = _ConvBNLink(conv, bn, parent_and_key(model, conv_name), parent_and_key(model, bn_name))
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


def efficient_conv_bn_pairs(model: M.Module) -> List[Tuple[str, str]]:
    """The (conv_name, bn_name) pairs of `model` currently switched to the efficient form.

    Args:
        model: the model.
    """
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


def enable_efficient_conv_bn_eval(model: M.Module, example_input: Any = None,
                                  pairs: Optional[Sequence[Tuple[str, str]]] = None) -> List[Tuple[str, str]]:
    """Switch every Conv2d -> BN pair of `model` whose conv output feeds only the BN, in place.

    If tracing fails and the model declares `conv_bn_pairs`, those are used (with a warning). Pairs where
    the conv has forward hooks or the BN forward pre-hooks (they would see different tensors) are left
    alone. Calling it again re-finds the pairs; `disable_efficient_conv_bn_eval` undoes it.

    Args:
        model: the model.
        example_input: a tensor/array or tuple of forward arguments to trace `model` on; default:
            `model.example_input`, `model.input_shape`, or inferred from the first conv's in_channels.
        pairs: (conv_name, bn_name) pairs to switch: skips the trace and trusts the caller.

    Returns:
        The switched (conv_name, bn_name) pairs.
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


def disable_efficient_conv_bn_eval(model: M.Module) -> List[Tuple[str, str]]:
    """Undo `enable_efficient_conv_bn_eval` on `model` (in place).

    Args:
        model: the model.

    Returns:
        The (conv_name, bn_name) pairs that were switched.
    """
    pairs = efficient_conv_bn_pairs(model)
    for _, mod in model.named_modules():
        _unswitch(mod)
    return pairs


def fold_conv_bn(conv: M.Module, bn: M.Module) -> Tuple[np.ndarray, np.ndarray]:
    """The weight and bias of the single conv equal to bn(conv(x)) with BN's running statistics.

    Args:
        conv: a Conv2d.
        bn: the BN layer that follows it.

    Returns:
        (weight, bias) float32 numpy arrays; bias of shape (1, C, 1, 1).
    """
    scale, shift = _scale_shift(bn, conv.bias)
    weight = fold_weight(conv.weight, scale)
    return weight.numpy().astype(np.float32), shift.numpy().astype(np.float32).reshape(1, -1, 1, 1)


def fuse_conv_bn(model: M.Module, example_input: Any = None,
                 pairs: Optional[Sequence[Tuple[str, str]]] = None) -> M.Module:
    """Inference copy of `model` (deep copy, eval mode) with each conv -> BN pair folded into the conv.

    The conv gets the folded weight and a bias, the BN is replaced by a :class:`.activation.PassThrough`
    identity (its state-dict keys disappear; the conv gains a `bias` key where it had none), or by a
    :class:`.bn_act.NormActTail` applying the BN's activation when it has one. BNs without running
    statistics are left in place.

    Args:
        model: the model (left unchanged).
        example_input: the input to find the pairs by tracing, as in `enable_efficient_conv_bn_eval`.
        pairs: (conv_name, bn_name) pairs to fold: skips the trace.

    Returns:
        The fused copy.
    """
    fused = copy.deepcopy(model)
    disable_efficient_conv_bn_eval(fused)
    fused.eval()
    if pairs is None:
        pairs = _find_or_declared(fused, example_input)
    for conv_name, bn_name in pairs:
        conv, bn = _check_pair(fused, conv_name, bn_name)
        if not (has_running_stats(bn) or is_frozen_bn(bn)):
            continue
        weight, bias = fold_conv_bn(conv, bn)
        conv.weight = mge.Parameter(weight)
        conv.bias = mge.Parameter(bias)
        set_module(fused, bn_name, carry_act(bn, PassThrough()))  # a BN's activation stays (bn_act)
    return fused
