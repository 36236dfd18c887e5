"""basecls's ResNet variants on :class:`~basebn.models.anynet.AnyNet` (keys ``stem.*``, ``s1.b1.a``, ``head.fc``).

ResNet-101/152, ResNet-D (deep stem + avg-down shortcut), ResNeXt, SE-ResNet(Xt) and Wide ResNet, with
basecls's names and exact layouts. basebn's own resnet18/34/50 (torchvision key names) stay in
:mod:`basebn.models.resnet` (``build_resnet(18 | 34 | 50)`` gives their basecls layout).
Quirk kept from basecls: ``wide_resnet*_2`` keeps group widths 64..512 at bottleneck widths 128..1024,
so its 3x3 convs have 2 groups (46.2 M parameters for wide_resnet50_2, not torchvision's 68.9 M).
"""
from .anynet import AnyNet, ResBasicBlock, ResBottleneckBlock, ResDeepStem, ResStem

__all__ = [
    "resnet101", "resnet152", "resnet18d", "resnet34d", "resnet50d", "resnet101d", "resnet152d",
    "resnext50_32x4d", "resnext101_32x4d", "resnext101_32x8d", "resnext101_64x4d",
    "resnext152_32x4d", "resnext152_32x8d", "resnext152_64x4d",
    "se_resnet18", "se_resnet34", "se_resnet50", "se_resnet101", "se_resnet152",
    "se_resnext50_32x4d", "se_resnext101_32x4d", "se_resnext101_32x8d", "se_resnext101_64x4d",
    "se_resnext152_32x4d", "se_resnext152_32x8d", "se_resnext152_64x4d",
    "wide_resnet50_2", "wide_resnet101_2",
]

_DEPTHS = {18: [2, 2, 2, 2], 34: [3, 4, 6, 3], 50: [3, 4, 6, 3], 101: [3, 4, 23, 3], 152: [3, 8, 36, 3]}
_BASIC_WIDTHS = [64, 128, 256, 512]
_BOTTLENECK_WIDTHS = [256, 512, 1024, 2048]
SE_RATIO = 0.0625


def build_resnet(depth, bot_mul=None, group_ws=None, deep_stem=False, **kw):
    """basecls's ResNet-`depth` on AnyNet; `bot_mul` / `group_ws` override the bottleneck (ResNeXt, wide).

    kw: num_classes, in_channels, norm, bn_momentum, bn_eps, se_r, drop_path_prob, zero_init_residual, ...
    """
    stem = ResDeepStem if deep_stem else ResStem
    kw.setdefault("avg_down", deep_stem)
    if depth < 50:
        return AnyNet(stem, 64, ResBasicBlock, _DEPTHS[depth], _BASIC_WIDTHS, [1, 2, 2, 2], **kw)
    bot_mul = 0.25 if bot_mul is None else bot_mul
    group_ws = _BASIC_WIDTHS if group_ws is None else group_ws
    return AnyNet(stem, 64, ResBottleneckBlock, _DEPTHS[depth], _BOTTLENECK_WIDTHS, [1, 2, 2, 2],
                  bot_muls=bot_mul, group_ws=group_ws, **kw)


def _resnext(depth, groups, group_w, **kw):
    """ResNeXt-`depth` `groups`x`group_w`d: bottleneck width = groups * group_w in stage 1, doubling."""
    bot_mul = groups * group_w / 256
    return build_resnet(depth, bot_mul=bot_mul, group_ws=[group_w * 2 ** i for i in range(4)], **kw)


def resnet101(**kw):
    """ResNet-101, basecls layout."""
    return build_resnet(101, **kw)


def resnet152(**kw):
    """ResNet-152, basecls layout."""
    return build_resnet(152, **kw)


def resnet18d(**kw):
    """ResNet-18-D (deep stem, avg-down shortcut), basecls layout."""
    return build_resnet(18, deep_stem=True, **kw)


def resnet34d(**kw):
    """ResNet-34-D (deep stem, avg-down shortcut), basecls layout."""
    return build_resnet(34, deep_stem=True, **kw)


def resnet50d(**kw):
    """ResNet-50-D (deep stem, avg-down shortcut), basecls layout."""
    return build_resnet(50, deep_stem=True, **kw)


def resnet101d(**kw):
    """ResNet-101-D (deep stem, avg-down shortcut), basecls layout."""
    return build_resnet(101, deep_stem=True, **kw)


def resnet152d(**kw):
    """ResNet-152-D (deep stem, avg-down shortcut), basecls layout."""
    return build_resnet(152, deep_stem=True, **kw)


def resnext50_32x4d(**kw):
    """ResNeXt-50 32x4d, basecls layout."""
    return _resnext(50, 32, 4, **kw)


def resnext101_32x4d(**kw):
    """ResNeXt-101 32x4d, basecls layout."""
    return _resnext(101, 32, 4, **kw)


def resnext101_32x8d(**kw):
    """ResNeXt-101 32x8d, basecls layout."""
    return _resnext(101, 32, 8, **kw)


def resnext101_64x4d(**kw):
    """ResNeXt-101 64x4d, basecls layout."""
    return _resnext(101, 64, 4, **kw)


def resnext152_32x4d(**kw):
    """ResNeXt-152 32x4d, basecls layout."""
    return _resnext(152, 32, 4, **kw)


def resnext152_32x8d(**kw):
    """ResNeXt-152 32x8d, basecls layout."""
    return _resnext(152, 32, 8, **kw)


def resnext152_64x4d(**kw):
    """ResNeXt-152 64x4d, basecls layout."""
    return _resnext(152, 64, 4, **kw)


def se_resnet18(**kw):
    """SE-ResNet-18, basecls layout."""
    return build_resnet(18, se_r=SE_RATIO, **kw)


def se_resnet34(**kw):
    """SE-ResNet-34, basecls layout."""
    return build_resnet(34, se_r=SE_RATIO, **kw)


def se_resnet50(**kw):
    """SE-ResNet-50, basecls layout."""
    return build_resnet(50, se_r=SE_RATIO, **kw)


def se_resnet101(**kw):
    """SE-ResNet-101, basecls layout."""
    return build_resnet(101, se_r=SE_RATIO, **kw)


def se_resnet152(**kw):
    """SE-ResNet-152, basecls layout."""
    return build_resnet(152, se_r=SE_RATIO, **kw)


def se_resnext50_32x4d(**kw):
    """SE-ResNeXt-50 32x4d, basecls layout."""
    return _resnext(50, 32, 4, se_r=SE_RATIO, **kw)


def se_resnext101_32x4d(**kw):
    """SE-ResNeXt-101 32x4d, basecls layout."""
    return _resnext(101, 32, 4, se_r=SE_RATIO, **kw)


def se_resnext101_32x8d(**kw):
    """SE-ResNeXt-101 32x8d, basecls layout."""
    return _resnext(101, 32, 8, se_r=SE_RATIO, **kw)


def se_resnext101_64x4d(**kw):
    """SE-ResNeXt-101 64x4d, basecls layout."""
    return _resnext(101, 64, 4, se_r=SE_RATIO, **kw)


def se_resnext152_32x4d(**kw):
    """SE-ResNeXt-152 32x4d, basecls layout."""
    return _resnext(152, 32, 4, se_r=SE_RATIO, **kw)


def se_resnext152_32x8d(**kw):
    """SE-ResNeXt-152 32x8d, basecls layout."""
    return _resnext(152, 32, 8, se_r=SE_RATIO, **kw)


def se_resnext152_64x4d(**kw):
    """SE-ResNeXt-152 64x4d, basecls layout."""
    return _resnext(152, 64, 4, se_r=SE_RATIO, **kw)


def wide_resnet50_2(**kw):
    """basecls's Wide ResNet-50-2 (bottleneck x2, 2-group 3x3: basecls quirk)."""
    return build_resnet(50, bot_mul=0.5, **kw)


def wide_resnet101_2(**kw):
    """basecls's Wide ResNet-101-2 (bottleneck x2, 2-group 3x3: basecls quirk)."""
    return build_resnet(101, bot_mul=0.5, **kw)
