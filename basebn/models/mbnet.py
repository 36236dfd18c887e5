"""MobileNet V1 / V2 / V3 with basecls's names, widths and module names (``stem``, ``s1.b1.dwise``, ``head``).

One block, :class:`MBConv` (inverted bottleneck: [1x1 expand, norm, act], kxk depthwise, norm, act, [SE],
1x1 project, norm, [act], [skip]), covers all three versions. BN defaults: basecls's, momentum 0.9, eps 1e-5,
for V3 too (MegEngine's BatchNorm2d defaults, as basecls builds them; the V3 paper's are 0.99 / 1e-3).
The expand, depthwise and (V1) project BNs carry the activation after them when it has a fused form
(:func:`~basebn.layers.bn_act.norm_then_act`: relu / relu6 today, not hswish; same names and state dict).
"""
from numbers import Real

import megengine.module as M

from ..layers.bn_act import norm_then_act
from ..layers.conv import conv_and_identity
from ..layers.conv_norm_act import padded_conv
from ..layers.divisible import make_divisible
from ..layers.drop_path import DropPath
from ..layers.se import SqueezeExcite, se_width
from .anynet import AnyStage, SimpleStem, StagedNet, linear_drop_path_probs
from .heads import ClsHead, MBV3Head
from .norm_factory import norm_factory

__all__ = ["InvertedResidual", "MBConv", "MBNet", "MBNET_CONFIGS", "MBNET_NAMES", "build_mbnet"]


class InvertedResidual(M.Module):
    """[expand, norm, act], [depthwise, norm, act], [SE], project, norm, [act], [drop path + skip]: the forward
    MBConv and FuseMBConv share (FuseMBConv has no depthwise step: dwise is None)."""

    def last_norm(self):
        """The projection norm when the block is residual (zero-init target), else None."""
        return self.proj_bn if self.has_skip else None

    def forward(self, x):
        x_p, first = x, self.exp if self.exp is not None else self.dwise
        if first is not None:  # with a skip, x's two gradients are summed in first's data-gradient op
            x, x_p = conv_and_identity(first, x) if self.has_skip else (first(x), x)
        if self.exp is not None:
            x = self.exp_act(self.exp_bn(x))
            if self.dwise is not None:
                x = self.dwise(x)
        if self.dwise is not None:
            x = self.dwise_act(self.dwise_bn(x))
        if self.se is not None:
            x = self.se(x)
        x = self.proj_bn(self.proj(x))
        if self.proj_act is not None:
            x = self.proj_act(x)
        if self.has_skip:
            x = self.drop_path(x) + x_p
        return x


class MBConv(InvertedResidual):
    """Inverted residual block. SE width: `se_rule` applied to the expanded width (`se_from_exp`) or the input."""

    def __init__(self, w_in, w_out, stride, norm_layer, act="relu6", kernel=3, exp_r=1.0, se_r=0.0,
                 se_from_exp=True, se_act="relu", se_hard_gate=True, se_rule="divisible_0.9",
                 has_proj_act=False, has_skip=True, drop_path_prob=0.0):
        super().__init__()
        w_mid = w_in
        self.exp = None
        if exp_r != 1.0:
            w_mid = make_divisible(w_in * exp_r, round_limit=0.9)
            self.exp, (self.exp_bn, self.exp_act) = padded_conv(w_in, w_mid, 1), norm_then_act(norm_layer(w_mid), act)
        self.dwise = padded_conv(w_mid, w_mid, kernel, stride=stride, groups=w_mid)
        self.dwise_bn, self.dwise_act = norm_then_act(norm_layer(w_mid), act)
        w_se = se_width(w_mid if se_from_exp else w_in, se_r, se_rule)
        self.se = SqueezeExcite(w_mid, w_se, se_act, hard_gate=se_hard_gate) if w_se > 0 else None
        self.proj, self.proj_bn, self.proj_act = padded_conv(w_mid, w_out, 1), norm_layer(w_out), None
        if has_proj_act:
            self.proj_bn, self.proj_act = norm_then_act(self.proj_bn, act)
        self.has_skip = has_skip and w_in == w_out and stride == 1
        self.drop_path = DropPath(drop_path_prob) if self.has_skip else None


def _per_block(value, depth):
    return [value] * depth if isinstance(value, Real) else list(value)


class MBNet(StagedNet):
    """stem -> MBConv stages -> head ("cls": ClsHead, "mbv3": MBV3Head), widths scaled by `width_mult`."""

    def __init__(self, stem_w, depths, widths, strides, kernels, exp_rs=1.0, se_rs=0.0, stage_acts=None,
                 has_proj_act=False, has_skip=True, drop_path_prob=0.0, width_mult=1.0, head="cls",
                 head_width=0, head_w_h=1280, dropout=0.0, num_classes=1000, in_channels=3, norm="BN",
                 bn_momentum=None, bn_eps=None, act="relu6", zero_init_residual=False):
        super().__init__()
        norm_layer = norm_factory(norm, bn_momentum, bn_eps)
        n = len(depths)
        self.depths = list(depths)
        stem_w = make_divisible(stem_w * width_mult, round_limit=0.9)
        self.stem = SimpleStem(in_channels, stem_w, norm_layer, act)
        widths = [make_divisible(w * width_mult, round_limit=0.9) for w in widths]
        exp_rs = [exp_rs] * n if isinstance(exp_rs, Real) else exp_rs
        se_rs = [se_rs] * n if isinstance(se_rs, Real) else se_rs
        stage_acts = stage_acts or [act] * n
        drop_probs = linear_drop_path_probs(depths, drop_path_prob)
        prev_w = stem_w
        for i, (d, w, s, k) in enumerate(zip(depths, widths, strides, kernels)):
            kwargs = [dict(norm_layer=norm_layer, act=stage_acts[i], kernel=k, exp_r=e, se_r=se_rs[i],
                           has_proj_act=has_proj_act, has_skip=has_skip, drop_path_prob=p)
                      for e, p in zip(_per_block(exp_rs[i], d), drop_probs[i])]
            setattr(self, f"s{i + 1}", AnyStage(prev_w, w, s, d, MBConv, kwargs))
            prev_w = w
        if head_width > 0:
            head_width = make_divisible(head_width * max(1.0, width_mult), round_limit=0.9)
        if head == "mbv3":
            self.head = MBV3Head(prev_w, num_classes, norm_layer, act, width=head_width,
                                 w_h=make_divisible(head_w_h * width_mult, round_limit=0.9), dropout=dropout)
        else:
            self.head = ClsHead(prev_w, num_classes, norm_layer, act, width=head_width, dropout=dropout)
        self.initialize(zero_init_residual)


MBNET_CONFIGS = {
    "v1": dict(stem_w=32, depths=[1, 2, 2, 6, 2], widths=[64, 128, 256, 512, 1024], strides=[1, 2, 2, 2, 2],
               kernels=[3] * 5, has_proj_act=True, has_skip=False, dropout=0.2),
    "v2": dict(stem_w=32, depths=[1, 2, 3, 4, 3, 3, 1], widths=[16, 24, 32, 64, 96, 160, 320],
               strides=[1, 2, 2, 2, 1, 2, 1], kernels=[3] * 7, exp_rs=[1, 6, 6, 6, 6, 6, 6], head_width=1280,
               dropout=0.2),
    "v3_small": dict(stem_w=16, depths=[1, 2, 3, 2, 3], widths=[16, 24, 40, 48, 96], strides=[2, 2, 2, 1, 2],
                     kernels=[3, 3, 5, 5, 5], exp_rs=[1, [4.5, 3.67], [4, 6, 6], 3, 6],
                     se_rs=[0.25, 0, 0.25, 0.25, 0.25], stage_acts=["relu", "relu", "hswish", "hswish", "hswish"],
                     act="hswish", head="mbv3", head_width=576, head_w_h=1024, dropout=0.2),
    "v3_large": dict(stem_w=16, depths=[1, 2, 3, 4, 2, 3], widths=[16, 24, 40, 80, 112, 160],
                     strides=[1, 2, 2, 2, 1, 2], kernels=[3, 3, 5, 3, 3, 5],
                     exp_rs=[1, [4, 3], 3, [6, 2.5, 2.3, 2.3], 6, 6],
                     se_rs=[0, 0, 0.25, 0, 0.25, 0.25],
                     stage_acts=["relu", "relu", "relu", "hswish", "hswish", "hswish"], act="hswish", head="mbv3",
                     head_width=960, head_w_h=1280, dropout=0.2),
}

# name: (config, width multiplier)
MBNET_NAMES = {
    "mbnetv1_x025": ("v1", 0.25), "mbnetv1_x050": ("v1", 0.5), "mbnetv1_x075": ("v1", 0.75),
    "mbnetv1_x100": ("v1", 1.0),
    "mbnetv2_x035": ("v2", 0.35), "mbnetv2_x050": ("v2", 0.5), "mbnetv2_x075": ("v2", 0.75),
    "mbnetv2_x100": ("v2", 1.0), "mbnetv2_x140": ("v2", 1.4),
    "mbnetv3_small_x075": ("v3_small", 0.75), "mbnetv3_small_x100": ("v3_small", 1.0),
    "mbnetv3_large_x075": ("v3_large", 0.75), "mbnetv3_large_x100": ("v3_large", 1.0),
}


def build_mbnet(name, **kw):
    """The MobileNet `name` (a key of MBNET_NAMES); kw override the config (num_classes, norm, dropout, ...)."""
    config, width_mult = MBNET_NAMES[name]
    args = dict(MBNET_CONFIGS[config], width_mult=width_mult)
    args.update(kw)
    return MBNet(**args)
