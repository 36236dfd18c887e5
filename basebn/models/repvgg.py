"""RepVGG (Ding et al. 2021) with basecls's names and module names, and :func:`reparameterize`.

Training block: act(SE(bn(conv3x3(x)) + bn(conv1x1(x)) + bn(x))) with branches ``rbr_dense.{conv,bn}``,
``rbr_1x1.{conv,bn}`` and ``rbr_identity`` (a norm, only when shape is kept). :func:`reparameterize`
folds the three branches (running statistics, as in eval mode) into one 3x3 conv with bias,
``rbr_reparam``, using :func:`basebn.layers.fold_conv_bn` for every branch (the identity as a
3x3 conv with a unit centre tap).
"""
from numbers import Real

import numpy as np

import megengine as mge
import megengine.module as M

from ..layers.activation import PassThrough, build_activation
from ..layers.conv_bn import fold_conv_bn
from ..layers.conv_norm_act import ConvNormAct, padded_conv
from ..layers.norm import has_running_stats, is_frozen_bn
from ..layers.se import SqueezeExcite, se_width
from .heads import ClsHead
from .norm_factory import norm_factory
from .weight_init import init_weights

__all__ = ["RepVGGBlock", "RepVGG", "reparameterize", "REPVGG_NAMES", "build_repvgg"]


def identity_conv(channels, groups):
    """A bias-free 3x3 conv (groups `groups`) computing the identity."""
    conv = M.Conv2d(channels, channels, 3, padding=1, groups=groups, bias=False)
    per_group = channels // groups
    kernel = np.zeros((channels, per_group, 3, 3), np.float32)
    kernel[np.arange(channels), np.arange(channels) % per_group, 1, 1] = 1.0
    conv.weight = mge.Parameter(kernel.reshape(conv.weight.shape))
    return conv


def _pad_to_3x3(weight):
    pad = [(0, 0)] * (weight.ndim - 2) + [(1, 1), (1, 1)]
    return np.pad(weight, pad)


class RepVGGBlock(M.Module):
    """3x3 + 1x1 + identity branches (training form) or one 3x3 conv with bias (``deploy=True``)."""

    def __init__(self, w_in, w_out, stride, norm_layer, groups=1, se_r=0.0, act="relu", deploy=False):
        super().__init__()
        self.w_in, self.w_out, self.stride, self.groups = w_in, w_out, stride, groups
        self.nonlinearity = build_activation(act)
        w_se = se_width(w_out, se_r, "floor")
        self.se = SqueezeExcite(w_out, w_se, act) if w_se > 0 else PassThrough()
        self.rbr_reparam = self.rbr_dense = self.rbr_1x1 = self.rbr_identity = None
        if deploy:
            self.rbr_reparam = padded_conv(w_in, w_out, 3, stride=stride, groups=groups, bias=True)
        else:
            self.rbr_identity = norm_layer(w_in) if w_in == w_out and stride == 1 else None
            self.rbr_dense = ConvNormAct(w_in, w_out, 3, norm_layer, act=None, stride=stride, groups=groups)
            self.rbr_1x1 = ConvNormAct(w_in, w_out, 1, norm_layer, act=None, stride=stride, groups=groups)

    def forward(self, x):
        if self.rbr_reparam is not None:
            return self.nonlinearity(self.se(self.rbr_reparam(x)))
        out = self.rbr_dense(x) + self.rbr_1x1(x)
        if self.rbr_identity is not None:
            out = out + self.rbr_identity(x)
        return self.nonlinearity(self.se(out))

    def equivalent_kernel_bias(self):
        """(weight, bias) numpy arrays of the 3x3 conv equal to the three branches with running statistics."""
        weight, bias = fold_conv_bn(self.rbr_dense.conv, self.rbr_dense.bn)
        w1, b1 = fold_conv_bn(self.rbr_1x1.conv, self.rbr_1x1.bn)
        weight, bias = weight + _pad_to_3x3(w1), bias + b1
        if self.rbr_identity is not None:
            wi, bi = fold_conv_bn(identity_conv(self.w_in, self.groups), self.rbr_identity)
            weight, bias = weight + wi, bias + bi
        return weight, bias

    def reparameterize(self):
        """Switch this block to its deploy form in place (branches removed, ``rbr_reparam`` added)."""
        if self.rbr_reparam is not None:
            return
        norms = [self.rbr_dense.bn, self.rbr_1x1.bn] + ([self.rbr_identity] if self.rbr_identity is not None else [])
        if not all(has_running_stats(n) or is_frozen_bn(n) for n in norms):
            raise TypeError("reparameterize needs BN layers with running statistics (norm BN, SyncBN or FrozenBN)")
        weight, bias = self.equivalent_kernel_bias()
        conv = padded_conv(self.w_in, self.w_out, 3, stride=self.stride, groups=self.groups, bias=True)
        conv.weight, conv.bias = mge.Parameter(weight), mge.Parameter(bias)
        conv.training = self.training
        self.rbr_reparam = conv
        self.rbr_dense = self.rbr_1x1 = self.rbr_identity = None


def reparameterize(model: M.Module) -> M.Module:
    """Fold every RepVGGBlock of `model` into its single-conv deploy form, in place.

    Outputs equal the training form's in eval mode (BN running statistics are folded). The state
    dict changes (``rbr_reparam.weight/bias`` replace the branches): build an optimizer afterwards.

    Args:
        model: a model holding RepVGGBlocks (others are left as they are).

    Returns:
        `model`.
    """
    for m in list(model.modules()):
        if isinstance(m, RepVGGBlock):
            m.reparameterize()
    return model


class RepVGG(M.Module):
    """stage0 (one /2 block from the input) -> stage1..4 (first block /2) -> ClsHead.

    Stage widths: 64, 128, 256, 512 times `width_multiplier`; stage0 is min(64, 64 * wm[0]) wide.
    `groups`: one int, or per stage an int or a per-block list (basecls's g2 / g4 variants).
    """

    def __init__(self, num_blocks, width_multiplier, groups=1, se_r=0.0, deploy=False, num_classes=1000,
                 in_channels=3, norm="BN", bn_momentum=None, bn_eps=None, act="relu"):
        super().__init__()
        norm_layer = norm_factory(norm, bn_momentum, bn_eps)
        groups = [groups] * len(num_blocks) if isinstance(groups, Real) else groups
        w_in = min(64, int(64 * width_multiplier[0]))
        block = dict(norm_layer=norm_layer, se_r=se_r, act=act, deploy=deploy)
        self.stage0 = RepVGGBlock(in_channels, w_in, 2, **block)
        for s, (depth, base) in enumerate(zip(num_blocks, (64, 128, 256, 512))):
            w_out = int(base * width_multiplier[s])
            stage_groups = [groups[s]] * depth if isinstance(groups[s], Real) else groups[s]
            blocks = []
            for i in range(depth):
                blocks.append(RepVGGBlock(w_in, w_out, 2 if i == 0 else 1, groups=stage_groups[i], **block))
                w_in = w_out
            setattr(self, f"stage{s + 1}", M.Sequential(*blocks))
        self.head = ClsHead(w_in, num_classes, norm_layer, act)
        init_weights(self)

    def features(self, x):
        x = self.stage0(x)
        for i in range(1, 5):
            x = getattr(self, f"stage{i}")(x)
        return x

    def forward(self, x):
        return self.head(self.features(x))


def _alternating(group, depths=(4, 6, 16, 1)):
    """basecls's g2 / g4 pattern: groups 1, g, 1, g, ... per block in stages 1-3; 1 in stage 4."""
    return [[1 if i % 2 == 0 else group for i in range(d)] for d in depths[:3]] + [[1] * depths[3]]


_B = [4, 6, 16, 1]
# name: constructor arguments (basecls)
REPVGG_NAMES = {
    "repvgg_a0": dict(num_blocks=[2, 4, 14, 1], width_multiplier=[0.75, 0.75, 0.75, 2.5]),
    "repvgg_a1": dict(num_blocks=[2, 4, 14, 1], width_multiplier=[1, 1, 1, 2.5]),
    "repvgg_a2": dict(num_blocks=[2, 4, 14, 1], width_multiplier=[1.5, 1.5, 1.5, 2.75]),
    "repvgg_b0": dict(num_blocks=_B, width_multiplier=[1, 1, 1, 2.5]),
    "repvgg_b1": dict(num_blocks=_B, width_multiplier=[2, 2, 2, 4]),
    "repvgg_b1g2": dict(num_blocks=_B, width_multiplier=[2, 2, 2, 4], groups=_alternating(2)),
    "repvgg_b1g4": dict(num_blocks=_B, width_multiplier=[2, 2, 2, 4], groups=_alternating(4)),
    "repvgg_b2": dict(num_blocks=_B, width_multiplier=[2.5, 2.5, 2.5, 5]),
    "repvgg_b2g2": dict(num_blocks=_B, width_multiplier=[2.5, 2.5, 2.5, 5], groups=_alternating(2)),
    "repvgg_b2g4": dict(num_blocks=_B, width_multiplier=[2.5, 2.5, 2.5, 5], groups=_alternating(4)),
    "repvgg_b3": dict(num_blocks=_B, width_multiplier=[3, 3, 3, 5]),
    "repvgg_b3g2": dict(num_blocks=_B, width_multiplier=[3, 3, 3, 5], groups=_alternating(2)),
    "repvgg_b3g4": dict(num_blocks=_B, width_multiplier=[3, 3, 3, 5], groups=_alternating(4)),
    "repvgg_d2": dict(num_blocks=[8, 14, 24, 1], width_multiplier=[2.5, 2.5, 2.5, 5], se_r=0.0625),
}


def build_repvgg(name, **kw):
    """The RepVGG `name` (a key of REPVGG_NAMES); ``deploy=True`` builds the reparameterized form."""
    args = dict(REPVGG_NAMES[name])
    args.update(kw)
    return RepVGG(**args)
