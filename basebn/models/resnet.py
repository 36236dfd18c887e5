"""ResNets: CIFAR-style (ResNet-20/32/56, He et al. 2016 sec. 4.2) and ImageNet-style (18/34/50).

Module names follow torchvision (conv1, bn1, layer1..4, downsample, fc) so users recognise them.
`stem="small"` replaces the 7x7/2 conv + max-pool by a 3x3 conv (stride `stem_stride`) for 28-32 px inputs.
A norm followed by a ReLU, and the norm -> residual add -> ReLU that ends a block, run as one layer
(:mod:`basebn.layers.bn_act`: same module names and state dict; fused kernels for BN and SyncBN); GN and BRN
run the three ops.
"""
from typing import Optional, Sequence

import megengine.functional as F
import megengine.module as M

from ..layers.bn_act import norm_act, with_act
from ..layers.conv import Conv2d, conv_and_identity
from ..layers.linear import Linear
from ..layers.max_pool import MaxPool2d
from .norm_factory import norm_factory
from .weight_init import init_weights_torchvision, zero_init_last_norms

__all__ = ["ResNet", "cifar_resnet", "resnet20", "resnet32", "resnet56", "resnet18", "resnet34", "resnet50"]


def conv3x3(cin, cout, stride=1):
    """3x3 convolution, padding 1, no bias (basebn Conv2d: fast CPU weight gradient)."""
    return Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)


def conv1x1(cin, cout, stride=1):
    """1x1 convolution, no bias."""
    return Conv2d(cin, cout, 1, stride=stride, bias=False)


def first_conv_and_shortcut(conv, downsample, x):
    """``(conv(x), shortcut)`` of a block: x itself (``downsample`` None) or ``downsample(x)``; the shortcut's
    gradient w.r.t. x is summed inside the conv's data-gradient op (:func:`~basebn.layers.conv.conv_and_identity`)."""
    out, x = conv_and_identity(conv, x)
    return out, (x if downsample is None else downsample(x))


class BasicBlock(M.Module):
    """Two 3x3 conv-BN layers and a residual add (ResNet-18/34 and the CIFAR ResNets); expansion 1."""
    expansion = 1

    def __init__(self, cin, width, stride, norm):
        super().__init__()
        cout = width * self.expansion
        self.conv1, self.bn1 = conv3x3(cin, width, stride), with_act(norm(width), "relu")
        self.conv2, self.bn2 = conv3x3(width, cout), with_act(norm(cout), "relu")
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = M.Sequential(conv1x1(cin, cout, stride), norm(cout))

    def last_norm(self):
        """bn2, the norm that ends the residual branch (zero-init target)."""
        return self.bn2

    def forward(self, x):
        out, identity = first_conv_and_shortcut(self.conv1, self.downsample, x)
        out = norm_act(self.bn1, out, "relu")
        return norm_act(self.bn2, self.conv2(out), "relu", shortcut=identity)


class Bottleneck(M.Module):
    """1x1 reduce, 3x3, 1x1 expand (x4), each with BN, and a residual add (ResNet-50); expansion 4."""
    expansion = 4

    def __init__(self, cin, width, stride, norm):
        super().__init__()
        cout = width * self.expansion
        self.conv1, self.bn1 = conv1x1(cin, width), with_act(norm(width), "relu")
        self.conv2, self.bn2 = conv3x3(width, width, stride), with_act(norm(width), "relu")
        self.conv3, self.bn3 = conv1x1(width, cout), with_act(norm(cout), "relu")
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = M.Sequential(conv1x1(cin, cout, stride), norm(cout))

    def last_norm(self):
        """bn3, the norm that ends the residual branch (zero-init target)."""
        return self.bn3

    def forward(self, x):
        out, identity = first_conv_and_shortcut(self.conv1, self.downsample, x)
        out = norm_act(self.bn1, out, "relu")
        out = norm_act(self.bn2, self.conv2(out), "relu")
        return norm_act(self.bn3, self.conv3(out), "relu", shortcut=identity)


class ResNet(M.Module):
    """ResNet with torchvision key names (conv1, bn1, layer1.0.conv1, fc); "small" or "imagenet" stem.

    Args:
        block: the residual block class (BasicBlock or Bottleneck).
        depths: blocks per stage.
        widths: channels per stage (a Bottleneck's output is 4x its width).
        num_classes: outputs of the classifier.
        in_channels: channels of the input images.
        stem: "small" (one 3x3 conv, for 32 px inputs) or "imagenet" (7x7 stride-2 conv and max-pool).
        norm: the norm kind ("BN", "SyncBN", "FrozenBN", "GN", "BRN", "SyncBRN").
        bn_momentum: None: the family default below (MegEngine's convention: PyTorch's 0.1 is 0.9 here).
        bn_eps: None: the family default below.
        zero_init_residual: start every block's last norm with weight 0, so each block starts as identity.
        stem_stride: the stride of the "small" stem's conv.

    Raises:
        ValueError: an unknown stem.
    """

    default_bn_momentum, default_bn_eps = 0.9, 1e-5

    def __init__(self, block: type, depths: Sequence[int], widths: Sequence[int], num_classes: int = 10,
                 in_channels: int = 3, stem: str = "small", norm: str = "BN", bn_momentum: Optional[float] = None,
                 bn_eps: Optional[float] = None, zero_init_residual: bool = True, stem_stride: int = 1):
        super().__init__()
        norm_layer = norm_factory(norm, bn_momentum, bn_eps, self.default_bn_momentum, self.default_bn_eps)
        if stem == "imagenet":
            self.conv1 = Conv2d(in_channels, widths[0], 7, stride=2, padding=3, bias=False)
            self.maxpool = MaxPool2d(3, stride=2, padding=1)
        elif stem == "small":
            self.conv1 = conv3x3(in_channels, widths[0], stride=stem_stride)
            self.maxpool = None
        else:
            raise ValueError(f"unknown stem {stem!r}: model.stem must be 'small' or 'imagenet'")
        self.bn1 = with_act(norm_layer(widths[0]), "relu")
        cin, stages = widths[0], []
        for i, (depth, width) in enumerate(zip(depths, widths)):
            blocks = []
            for j in range(depth):
                stride = 2 if (i > 0 and j == 0) else 1
                blocks.append(block(cin, width, stride, norm_layer))
                cin = width * block.expansion
            stages.append(M.Sequential(*blocks))
        # layer1..layerK as attributes (torchvision names)
        self.num_stages = len(stages)
        for i, stage in enumerate(stages):
            setattr(self, f"layer{i + 1}", stage)
        self.fc = Linear(cin, num_classes)
        init_weights_torchvision(self)
        if zero_init_residual:
            zero_init_last_norms(self)

    def features(self, x):
        x = norm_act(self.bn1, self.conv1(x), "relu")
        if self.maxpool is not None:
            x = self.maxpool(x)
        for i in range(self.num_stages):
            x = getattr(self, f"layer{i + 1}")(x)
        return x

    def forward(self, x):
        x = F.mean(self.features(x), axis=(2, 3))
        return self.fc(x)


def cifar_resnet(depth, base_width=16, **kw):
    """ResNet-`depth` (6n + 2) with three stages of n basic blocks, `base_width` x (1, 2, 4) wide; kw go to ResNet."""
    if (depth - 2) % 6:
        raise ValueError(f"CIFAR ResNet depth must be 6n + 2, got {depth}")
    n = (depth - 2) // 6
    return ResNet(BasicBlock, [n, n, n], [base_width, base_width * 2, base_width * 4], **kw)


def _imagenet(block, depths, base_width=64, stem="imagenet", **kw):
    widths = [base_width * 2 ** i for i in range(4)]
    return ResNet(block, depths, widths, stem=stem, **kw)


def resnet20(**kw):
    """CIFAR-style ResNet-20: 3 stages of 3 BasicBlocks, widths 16/32/64 (base_width scales them)."""
    return cifar_resnet(20, **kw)


def resnet32(**kw):
    """CIFAR-style ResNet-32: 3 stages of 5 BasicBlocks."""
    return cifar_resnet(32, **kw)


def resnet56(**kw):
    """CIFAR-style ResNet-56: 3 stages of 9 BasicBlocks."""
    return cifar_resnet(56, **kw)


def resnet18(**kw):
    """ResNet-18: BasicBlocks [2, 2, 2, 2], widths 64-512, ImageNet stem by default."""
    return _imagenet(BasicBlock, [2, 2, 2, 2], **kw)


def resnet34(**kw):
    """ResNet-34: BasicBlocks [3, 4, 6, 3]."""
    return _imagenet(BasicBlock, [3, 4, 6, 3], **kw)


def resnet50(**kw):
    """ResNet-50: Bottlenecks [3, 4, 6, 3]."""
    return _imagenet(Bottleneck, [3, 4, 6, 3], **kw)
