"""EfficientNet B0-B8, EfficientNet-Lite and EfficientNetV2 with basecls's names, widths and module names.

Blocks: :class:`~basebn.models.mbnet.MBConv` (SE squeezed from the block *input* width, swish inside,
sigmoid gate) and :class:`FuseMBConv` (EfficientNetV2: expansion and depthwise fused into one kxk conv).
BN defaults: basecls's, momentum 0.9, eps 1e-5 (MegEngine's BatchNorm2d defaults, as basecls builds them; the
paper's are 0.99 / 1e-3): a basecls or timm checkpoint gives the original's logits with no BN kwargs.
A BN followed by an activation with a fused form (Lite's relu6; silu once fusable) carries it
(:func:`~basebn.layers.bn_act.norm_then_act`; same names and state dict).
"""
import math
from numbers import Real

from ..layers.bn_act import norm_then_act
from ..layers.conv_norm_act import padded_conv
from ..layers.divisible import make_divisible
from ..layers.drop_path import DropPath
from ..layers.se import SqueezeExcite, se_width
from .anynet import AnyStage, SimpleStem, StagedNet, linear_drop_path_probs
from .heads import ClsHead
from .mbnet import InvertedResidual, MBConv
from .norm_factory import norm_factory

__all__ = ["FuseMBConv", "EffNet", "EFFNET_NAMES", "build_effnet"]


class FuseMBConv(InvertedResidual):
    """[kxk expand (stride), norm, act], [SE], [1x1 project, norm] -- or, with exp_r 1, one kxk conv, norm, act."""

    def __init__(self, w_in, w_out, stride, norm_layer, act="silu", kernel=3, exp_r=1.0, se_r=0.0,
                 has_skip=True, drop_path_prob=0.0, **unused):
        super().__init__()
        w_mid, self.exp, self.dwise = w_in, None, None
        if exp_r != 1.0:
            w_mid = int(w_in * exp_r)
            self.exp = padded_conv(w_in, w_mid, kernel, stride=stride)
            self.exp_bn, self.exp_act = norm_then_act(norm_layer(w_mid), act)
        w_se = se_width(w_in, se_r, "floor")
        self.se = SqueezeExcite(w_mid, w_se, act, hard_gate=False) if w_se > 0 else None
        fused = self.exp is None
        self.proj = padded_conv(w_mid, w_out, kernel if fused else 1, stride=stride if fused else 1)
        self.proj_bn, self.proj_act = norm_layer(w_out), None
        if fused:
            self.proj_bn, self.proj_act = norm_then_act(self.proj_bn, act)
        self.has_skip = has_skip and w_in == w_out and stride == 1
        self.drop_path = DropPath(drop_path_prob) if self.has_skip else None


class EffNet(StagedNet):
    """stem -> stages of `blocks` (one block class per stage) -> ClsHead; depths scaled by `depth_mult`
    (ceil), widths by `width_mult`; `omit_mult` (Lite) keeps stem, head and first/last depths."""

    def __init__(self, stem_w, blocks, depths, widths, strides, kernels, exp_rs, se_rs=0.25, drop_path_prob=0.2,
                 depth_mult=1.0, width_mult=1.0, omit_mult=False, head_width=1280, dropout=0.2,
                 num_classes=1000, in_channels=3, norm="BN", bn_momentum=None, bn_eps=None, act="silu",
                 zero_init_residual=False):
        super().__init__()
        norm_layer = norm_factory(norm, bn_momentum, bn_eps)
        n = len(depths)
        self.depths = [d if omit_mult and i in (0, n - 1) else math.ceil(d * depth_mult) for i, d in enumerate(depths)]
        stem_w = stem_w if omit_mult else make_divisible(stem_w * width_mult, round_limit=0.9)
        self.stem = SimpleStem(in_channels, stem_w, norm_layer, act)
        widths = [make_divisible(w * width_mult, round_limit=0.9) for w in widths]
        se_rs = [se_rs] * n if isinstance(se_rs, Real) else se_rs
        drop_probs = linear_drop_path_probs(self.depths, drop_path_prob)
        prev_w = stem_w
        for i, (d, w, s) in enumerate(zip(self.depths, widths, strides)):
            kwargs = [dict(norm_layer=norm_layer, act=act, kernel=kernels[i], exp_r=exp_rs[i], se_r=se_rs[i],
                           se_from_exp=False, se_act=act, se_hard_gate=False, se_rule="floor", has_skip=True,
                           drop_path_prob=p) for p in drop_probs[i]]
            setattr(self, f"s{i + 1}", AnyStage(prev_w, w, s, d, blocks[i], kwargs))
            prev_w = w
        if head_width > 0 and not omit_mult:
            head_width = make_divisible(head_width * width_mult, round_limit=0.9)
        self.head = ClsHead(prev_w, num_classes, norm_layer, act, width=head_width, dropout=dropout)
        self.initialize(zero_init_residual)


_B0 = dict(stem_w=32, blocks=[MBConv] * 7, depths=[1, 2, 2, 3, 3, 4, 1], widths=[16, 24, 40, 80, 112, 192, 320],
           strides=[1, 2, 2, 2, 1, 2, 1], kernels=[3, 3, 5, 3, 5, 5, 3], exp_rs=[1, 6, 6, 6, 6, 6, 6])
_LITE = dict(_B0, se_rs=0.0, omit_mult=True, act="relu6")
_V2_BASE = dict(stem_w=32, blocks=[FuseMBConv] * 3 + [MBConv] * 3, depths=[1, 2, 2, 3, 5, 8],
                widths=[16, 32, 48, 96, 112, 192], strides=[1, 2, 2, 2, 1, 2], kernels=[3] * 6,
                exp_rs=[1, 4, 4, 4, 6, 6], se_rs=[0, 0, 0, 0.25, 0.25, 0.25])
_V2_LARGE = dict(_V2_BASE, blocks=[FuseMBConv] * 3 + [MBConv] * 4, strides=[1, 2, 2, 2, 1, 2, 1], kernels=[3] * 7,
                 exp_rs=[1, 4, 4, 4, 6, 6, 6], se_rs=[0, 0, 0, 0.25, 0.25, 0.25, 0.25])

# name: (base config, overrides) -- basecls's multipliers and dropout
EFFNET_NAMES = {
    "effnet_b0": (_B0, dict(depth_mult=1.0, width_mult=1.0)),
    "effnet_b1": (_B0, dict(depth_mult=1.1, width_mult=1.0)),
    "effnet_b2": (_B0, dict(depth_mult=1.2, width_mult=1.1, dropout=0.3)),
    "effnet_b3": (_B0, dict(depth_mult=1.4, width_mult=1.2, dropout=0.3)),
    "effnet_b4": (_B0, dict(depth_mult=1.8, width_mult=1.4, dropout=0.4)),
    "effnet_b5": (_B0, dict(depth_mult=2.2, width_mult=1.6, dropout=0.4)),
    "effnet_b6": (_B0, dict(depth_mult=2.6, width_mult=1.8, dropout=0.5)),
    "effnet_b7": (_B0, dict(depth_mult=3.1, width_mult=2.0, dropout=0.5)),
    "effnet_b8": (_B0, dict(depth_mult=3.6, width_mult=2.2, dropout=0.5)),
    "effnet_b0_lite": (_LITE, dict(depth_mult=1.0, width_mult=1.0)),
    "effnet_b1_lite": (_LITE, dict(depth_mult=1.1, width_mult=1.0)),
    "effnet_b2_lite": (_LITE, dict(depth_mult=1.2, width_mult=1.1, dropout=0.3)),
    "effnet_b3_lite": (_LITE, dict(depth_mult=1.4, width_mult=1.2, dropout=0.3)),
    "effnet_b4_lite": (_LITE, dict(depth_mult=1.8, width_mult=1.4, dropout=0.3)),
    "effnetv2_b0": (_V2_BASE, dict(depth_mult=1.0, width_mult=1.0)),
    "effnetv2_b1": (_V2_BASE, dict(depth_mult=1.1, width_mult=1.0)),
    "effnetv2_b2": (_V2_BASE, dict(depth_mult=1.2, width_mult=1.1, dropout=0.3)),
    "effnetv2_b3": (_V2_BASE, dict(depth_mult=1.4, width_mult=1.2, dropout=0.3)),
    "effnetv2_s": (_V2_BASE, dict(stem_w=24, depths=[2, 4, 4, 6, 9, 15], widths=[24, 48, 64, 128, 160, 256])),
    "effnetv2_m": (_V2_LARGE, dict(stem_w=24, depths=[3, 5, 5, 7, 14, 18, 5],
                                   widths=[24, 48, 80, 160, 176, 304, 512], dropout=0.3)),
    "effnetv2_l": (_V2_LARGE, dict(stem_w=32, depths=[4, 7, 7, 10, 19, 25, 7],
                                   widths=[32, 64, 96, 192, 224, 384, 640], dropout=0.4)),
}


def build_effnet(name, **kw):
    """The EfficientNet `name` (a key of EFFNET_NAMES); kw override the config."""
    base, overrides = EFFNET_NAMES[name]
    args = dict(base, **overrides)
    args.update(kw)
    return EffNet(**args)
