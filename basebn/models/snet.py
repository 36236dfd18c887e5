"""ShuffleNetV2 and ShuffleNetV2+ with basecls's names, widths and module names (``stage0.0.branch_main.0``).

A stride-1 block splits the input by :func:`~basebn.layers.channel_shuffle.shuffle_split` (the previous
block's channel shuffle), transforms one half and concatenates; a stride-2 block transforms both
copies (``branch_proj``, ``branch_main``). V2+ adds Xception-style blocks (kernel "x"), SE, hard swish
and an MBV3 head. A BN followed by an activation with a fused form (relu today, not hswish) carries it
(:func:`~basebn.layers.bn_act.norm_then_act`: the activation's Sequential slot holds an ``Identity``; same state dict).
"""
import megengine.functional as F
import megengine.module as M

from ..layers.bn_act import norm_then_act
from ..layers.channel_shuffle import shuffle_split
from ..layers.conv_norm_act import padded_conv
from ..layers.drop_path import DropPath
from ..layers.max_pool import MaxPool2d
from ..layers.se import SqueezeExcite, se_width
from .anynet import SimpleStem
from .heads import ClsHead, MBV3Head
from .norm_factory import norm_factory
from .weight_init import init_weights

__all__ = ["SNV2Block", "SNetV2", "SNET_NAMES", "build_snet"]


def _dw_pw(w_in, w_out, kernel, stride, norm_layer, act):
    """[kxk depthwise, norm, 1x1, norm, act] as a flat module list."""
    return [padded_conv(w_in, w_in, kernel, stride=stride, groups=w_in), norm_layer(w_in),
            padded_conv(w_in, w_out, 1), *norm_then_act(norm_layer(w_out), act)]


def _main_branch(w_in, w_mid, w_out, kernel, stride, norm_layer, act):
    """pw, norm, act, kxk dw, norm, pw, norm, act; kernel "x": three (dw 3x3, norm, pw, norm, act)."""
    if kernel == "x":
        return (_dw_pw(w_in, w_mid, 3, stride, norm_layer, act) + _dw_pw(w_mid, w_mid, 3, 1, norm_layer, act)
                + _dw_pw(w_mid, w_out, 3, 1, norm_layer, act))
    return [padded_conv(w_in, w_mid, 1), *norm_then_act(norm_layer(w_mid), act),
            padded_conv(w_mid, w_mid, kernel, stride=stride, groups=w_mid), norm_layer(w_mid),
            padded_conv(w_mid, w_out, 1), *norm_then_act(norm_layer(w_out), act)]


class SNV2Block(M.Module):
    """ShuffleNetV2 unit from w_in to w_out channels (stride 2: both branches; stride 1: half the input)."""

    def __init__(self, w_in, w_out, w_mid, kernel, stride, norm_layer, act="relu", se_r=0.0, drop_path_prob=0.0):
        super().__init__()
        self.stride = stride
        w_main_out = w_out - w_in
        self.branch_main = M.Sequential(*_main_branch(w_in, w_mid, w_main_out, kernel, stride, norm_layer, act))
        w_se = se_width(w_main_out, se_r, "floor")
        self.se = SqueezeExcite(w_main_out, w_se, act) if w_se > 0 else None
        self.drop_path = DropPath(drop_path_prob) if drop_path_prob > 0 else None
        self.branch_proj = None
        if stride == 2:
            self.branch_proj = M.Sequential(*_dw_pw(w_in, w_in, 3 if kernel == "x" else kernel, stride,
                                                    norm_layer, act))

    def forward(self, x):
        if self.stride == 1:
            x_proj, x = shuffle_split(x)
        else:
            x_proj = self.branch_proj(x)
        x = self.branch_main(x)
        if self.se is not None:
            x = self.se(x)
        if self.drop_path is not None:
            x = self.drop_path(x)
        return F.concat((x_proj, x), 1)


class SNetV2(M.Module):
    """stem (3x3/2) -> [max pool] -> stages ``stage0..`` of SNV2Blocks -> head ("cls" or "mbv3")."""

    def __init__(self, stem_w, depths, widths, strides, kernels, use_maxpool=True, se_r=0.0, drop_path_prob=0.0,
                 head="cls", head_width=1024, dropout=0.0, head_se_r=0.0, num_classes=1000, in_channels=3,
                 norm="BN", bn_momentum=None, bn_eps=None, act="relu"):
        super().__init__()
        norm_layer = norm_factory(norm, bn_momentum, bn_eps)
        self.stem = SimpleStem(in_channels, stem_w, norm_layer, act)
        self.maxpool = MaxPool2d(3, 2, 1) if use_maxpool else None
        self.num_stages = len(depths)
        prev_w, index, total = stem_w, 0, sum(depths)
        for s, (depth, width, stride, kernel) in enumerate(zip(depths, widths, strides, kernels)):
            kernel = [kernel] * depth if not isinstance(kernel, (list, tuple)) else kernel
            blocks = []
            for i in range(depth):
                index += 1
                blocks.append(SNV2Block(prev_w // 2 if i else prev_w, width, width // 2, kernel[i],
                                        1 if i else stride, norm_layer, act if s >= 1 else "relu",
                                        se_r if s >= 2 else 0.0, drop_path_prob * index / total))
                prev_w = width
            setattr(self, f"stage{s}", M.Sequential(*blocks))
        if head == "mbv3":
            self.head = MBV3Head(prev_w, num_classes, norm_layer, act, width=head_width, w_h=head_width,
                                 dropout=dropout, se_r=head_se_r, bias=False)
        else:
            self.head = ClsHead(prev_w, num_classes, norm_layer, act, width=head_width, dropout=dropout, bias=False)
        init_weights(self)

    def features(self, x):
        x = self.stem(x)
        if self.maxpool is not None:
            x = self.maxpool(x)
        for i in range(self.num_stages):
            x = getattr(self, f"stage{i}")(x)
        return x

    def forward(self, x):
        return self.head(self.features(x))


_V2 = dict(stem_w=24, depths=[4, 8, 4], strides=[2, 2, 2], kernels=[3, 3, 3], head_width=1024)
_V2_PLUS = dict(stem_w=16, use_maxpool=False, depths=[4, 4, 8, 4], strides=[2, 2, 2, 2],
                kernels=[[3, 3, "x", 5], [5, 5, 3, 3], [7, 3, 7, 5, 5, 3, 7, 3], [7, 5, "x", 7]], se_r=0.25,
                act="hswish", head="mbv3", head_width=1280, head_se_r=0.25, dropout=0.2)

# name: (base config, overrides)
SNET_NAMES = {
    "snetv2_x050": (_V2, dict(widths=[48, 96, 192])),
    "snetv2_x100": (_V2, dict(widths=[116, 232, 464])),
    "snetv2_x150": (_V2, dict(widths=[176, 352, 704])),
    "snetv2_x200": (_V2, dict(widths=[244, 488, 976], head_width=2048, dropout=0.2)),
    "snetv2p_x075": (_V2_PLUS, dict(widths=[36, 104, 208, 416])),
    "snetv2p_x100": (_V2_PLUS, dict(widths=[48, 128, 256, 512])),
    "snetv2p_x125": (_V2_PLUS, dict(widths=[68, 168, 336, 672])),
}


def build_snet(name, **kw):
    """The ShuffleNetV2(+) `name` (a key of SNET_NAMES); kw override the config."""
    base, overrides = SNET_NAMES[name]
    args = dict(base, **overrides)
    args.update(kw)
    return SNetV2(**args)
