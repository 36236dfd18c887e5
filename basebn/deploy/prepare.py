"""The inference form of a model: plain eval-mode ops only, every BN folded away.

SyncBN becomes plain BN, RepVGG blocks are reparameterized, each conv -> BN pair is fused into the
conv (weight and bias), and a BN that follows no conv (pre-activation ResNets) becomes a
:class:`ChannelAffine` ``x * s + t``. GroupNorm (``model.norm=GN``) and InstanceNorm become
:class:`GroupNormOps`, the same function written as reshape / mean / sqrt / elementwise ops (MegEngine's
own GroupNorm operator cannot be dumped for inference in 1.13). The result traces to a graph of stock
MegEngine ops.
"""
import copy

import numpy as np

import megengine as mge
import megengine.functional as F
import megengine.module as M

from ..layers import disable_efficient_conv_bn_eval, fuse_conv_bn, revert_sync_batchnorm
from ..layers.bn_act import carry_act
from ..layers.module_tree import replace_modules
from ..layers.norm import has_running_stats, is_bn, is_frozen_bn
from ..models import reparameterize
from .errors import ExportError

__all__ = ["ChannelAffine", "GroupNormOps", "prepare_for_export", "bn_scale_shift"]


def bn_scale_shift(bn):
    """(s, t) float32 arrays of shape (C,) with eval-mode bn(x) = x * s + t (per channel)."""
    c = bn.num_features

    def value(name, default):
        t = getattr(bn, name, None)
        return np.full(c, default, np.float32) if t is None else t.numpy().astype(np.float64).reshape(c)

    scale = value("weight", 1.0) / np.sqrt(value("running_var", 1.0) + bn.eps)
    shift = value("bias", 0.0) - value("running_mean", 0.0) * scale
    return scale.astype(np.float32), shift.astype(np.float32)


class ChannelAffine(M.Module):
    """``x * scale + shift`` along axis 1 (constants, any input rank >= 2): an eval BN without the BN op."""

    def __init__(self, scale, shift, name=None):
        super().__init__(name=name)
        self.scale = mge.Tensor(np.asarray(scale, np.float32))
        self.shift = mge.Tensor(np.asarray(shift, np.float32))

    def forward(self, x):
        shape = (1, -1) + (1,) * (x.ndim - 2)
        return x * self.scale.reshape(shape) + self.shift.reshape(shape)


class GroupNormOps(M.Module):
    """GroupNorm from primitive ops: per sample, the channels in `groups` groups are normalised over the
    group's channels and pixels (mean, biased variance), then ``* weight + bias`` per channel."""

    def __init__(self, groups, weight, bias, eps, name=None):
        super().__init__(name=name)
        self.groups, self.eps = int(groups), float(eps)
        self.weight = None if weight is None else mge.Tensor(np.asarray(weight, np.float32).reshape(1, -1, 1, 1))
        self.bias = None if bias is None else mge.Tensor(np.asarray(bias, np.float32).reshape(1, -1, 1, 1))

    @classmethod
    def from_module(cls, m):
        """The GroupNormOps computing eval-mode `m` (a megengine GroupNorm or InstanceNorm)."""
        groups = m.num_groups if isinstance(m, M.GroupNorm) else m.num_channels
        affine = m.affine and m.weight is not None
        return cls(groups, m.weight.numpy() if affine else None, m.bias.numpy() if affine else None, m.eps,
                   name=m.name)

    def forward(self, x):
        shape = x.shape
        g = x.reshape(shape[0], self.groups, -1)
        centred = g - g.mean(axis=2, keepdims=True)
        var = (centred * centred).mean(axis=2, keepdims=True)
        y = (centred / F.sqrt(var + self.eps)).reshape(shape)
        if self.weight is not None:
            y = y * self.weight + self.bias
        return y


def _group_norm_ops(m):
    return GroupNormOps.from_module(m) if isinstance(m, (M.GroupNorm, M.InstanceNorm)) else None


def _affine_for(name_of):
    def convert(m):
        if not is_bn(m):
            return None
        if not (has_running_stats(m) or is_frozen_bn(m)):
            raise ExportError(f"BN layer {name_of.get(id(m), '?')!r} keeps no running statistics "
                              f"(track_running_stats=False): its eval output depends on the batch, so it "
                              f"cannot be exported")
        return carry_act(m, ChannelAffine(*bn_scale_shift(m), name=m.name))  # (and its activation, if fused)
    return convert


def prepare_for_export(model, example_input):
    """A deep copy of `model` in eval mode ready to trace for deployment (`model` is left untouched).

    `example_input` (an array or tensor shaped like one batch) is used to find the conv -> BN pairs.
    The copy computes the same eval-mode function (up to float rounding of the folded weights).
    """
    model = copy.deepcopy(model)
    disable_efficient_conv_bn_eval(model)
    model.eval()
    model = revert_sync_batchnorm(model)
    reparameterize(model)
    fused = fuse_conv_bn(model, example_input=example_input)
    names = {id(m): n for n, m in fused.named_modules()}
    fused = replace_modules(fused, _affine_for(names))
    fused = replace_modules(fused, _group_norm_ops)
    fused.eval()
    return fused
