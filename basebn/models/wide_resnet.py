"""Wide ResNets WRN-d-k (Zagoruyko & Komodakis 2016) for 32 px inputs, pre-activation, as used by the
random-erasing paper (Zhong et al. 2020); module names follow its code (``block1.layer.0.bn1``,
``convShortcut``, ``bn1``, ``fc``).

Block: [bn, relu] -> 3x3 conv (stride) -> [bn, relu] -> [dropout] -> 3x3 conv, plus the input (or a
1x1 conv of the pre-activated input when the width changes). Its residual branch ends in a conv,
so there is no last norm to zero-initialise.
"""
import megengine.functional as F
import megengine.module as M

from ..layers.conv_norm_act import padded_conv
from ..layers.linear import Linear
from .norm_factory import norm_factory
from .weight_init import init_weights_wrn

__all__ = ["WideBasicBlock", "WideResNet", "wrn_16_8", "wrn_28_10", "wrn_40_4"]


class WideBasicBlock(M.Module):
    """Pre-activation basic block; `equal_in_out` blocks add their raw input, others a 1x1 conv of bn1's output."""

    def __init__(self, w_in, w_out, stride, norm_layer, dropout=0.0):
        super().__init__()
        self.bn1 = norm_layer(w_in)
        self.conv1 = padded_conv(w_in, w_out, 3, stride=stride)
        self.bn2 = norm_layer(w_out)
        self.conv2 = padded_conv(w_out, w_out, 3)
        self.dropout = M.Dropout(dropout) if dropout > 0 else None
        self.equal_in_out = w_in == w_out and stride == 1
        self.convShortcut = None if self.equal_in_out else padded_conv(w_in, w_out, 1, stride=stride)

    def forward(self, x):
        pre = F.relu(self.bn1(x))
        out = F.relu(self.bn2(self.conv1(pre)))
        if self.dropout is not None:
            out = self.dropout(out)
        out = self.conv2(out)
        return out + (x if self.equal_in_out else self.convShortcut(pre))


class _NetworkBlock(M.Module):
    def __init__(self, depth, w_in, w_out, stride, norm_layer, dropout):
        super().__init__()
        self.layer = M.Sequential(*[WideBasicBlock(w_in if i == 0 else w_out, w_out, stride if i == 0 else 1,
                                                   norm_layer, dropout) for i in range(depth)])

    def forward(self, x):
        return self.layer(x)


class WideResNet(M.Module):
    """WRN-`depth`-`widen_factor`: 3x3 conv (16) -> 3 groups of (depth - 4) / 6 blocks (16k, 32k, 64k wide;
    strides 1, 2, 2) -> bn, relu, global average pool, fc."""

    default_bn_momentum, default_bn_eps = 0.9, 1e-5

    def __init__(self, depth, widen_factor, dropout=0.0, num_classes=10, in_channels=3, norm="BN",
                 bn_momentum=None, bn_eps=None):
        super().__init__()
        if (depth - 4) % 6:
            raise ValueError(f"WRN depth must be 6n + 4, got {depth}")
        n = (depth - 4) // 6
        norm_layer = norm_factory(norm, bn_momentum, bn_eps, self.default_bn_momentum, self.default_bn_eps)
        widths = [16, 16 * widen_factor, 32 * widen_factor, 64 * widen_factor]
        self.conv1 = padded_conv(in_channels, widths[0], 3)
        self.block1 = _NetworkBlock(n, widths[0], widths[1], 1, norm_layer, dropout)
        self.block2 = _NetworkBlock(n, widths[1], widths[2], 2, norm_layer, dropout)
        self.block3 = _NetworkBlock(n, widths[2], widths[3], 2, norm_layer, dropout)
        self.bn1 = norm_layer(widths[3])
        self.fc = Linear(widths[3], num_classes)
        init_weights_wrn(self)

    def features(self, x):
        x = self.block3(self.block2(self.block1(self.conv1(x))))
        return F.relu(self.bn1(x))

    def forward(self, x):
        return self.fc(F.mean(self.features(x), axis=(2, 3)))


def wrn_16_8(num_classes=1000, **kw):
    """WRN-16-8 (11.0 M parameters at 10 classes)."""
    return WideResNet(16, 8, num_classes=num_classes, **kw)


def wrn_28_10(num_classes=1000, **kw):
    """WRN-28-10 (36.5 M parameters at 10 classes)."""
    return WideResNet(28, 10, num_classes=num_classes, **kw)


def wrn_40_4(num_classes=1000, **kw):
    """WRN-40-4 (8.9 M parameters at 10 classes)."""
    return WideResNet(40, 4, num_classes=num_classes, **kw)
