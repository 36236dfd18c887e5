"""Classifier heads with basecls's module names (``head.conv``, ``head.bn``, ``head.fc``, ...).

The conv heads' ``bn`` carries the activation after it when both have a fused form
(:func:`~basebn.layers.bn_act.norm_then_act`: ``act`` is then an ``Identity``; same state dict).
"""
import megengine.functional as F
import megengine.module as M

from ..layers.activation import build_activation
from ..layers.bn_act import norm_then_act
from ..layers.conv_norm_act import padded_conv
from ..layers.linear import Linear
from ..layers.pooling import AdaptiveAvgPool2d, GlobalAvgPool2d
from ..layers.se import SqueezeExcite

__all__ = ["ClsHead", "MBV3Head", "VGGHead"]


class ClsHead(M.Module):
    """[1x1 conv, norm, act] (when width > 0), global average pool, [dropout], fc."""

    def __init__(self, w_in, num_classes, norm_layer, act="relu", width=0, dropout=0.0, bias=True):
        super().__init__()
        self.width = width
        if width > 0:
            self.conv = padded_conv(w_in, width, 1)
            self.bn, self.act = norm_then_act(norm_layer(width), act)
            w_in = width
        self.avg_pool = GlobalAvgPool2d()
        self.dropout = M.Dropout(dropout) if dropout > 0 else None
        self.fc = Linear(w_in, num_classes, bias=bias)

    def forward(self, x):
        if self.width > 0:
            x = self.act(self.bn(self.conv(x)))
        x = F.flatten(self.avg_pool(x), 1)
        if self.dropout is not None:
            x = self.dropout(x)
        return self.fc(x)


class MBV3Head(M.Module):
    """MobileNetV3 head: 1x1 conv, norm, act, pool, [SE], fc (w_h), act, [dropout], fc."""

    def __init__(self, w_in, num_classes, norm_layer, act="hswish", width=960, w_h=1280, dropout=0.0,
                 se_r=0.0, bias=True):
        super().__init__()
        self.conv = padded_conv(w_in, width, 1)
        self.bn, self.act = norm_then_act(norm_layer(width), act)
        self.avg_pool = GlobalAvgPool2d()
        self.se = SqueezeExcite(width, int(se_r * width), act) if se_r > 0 else None
        self.h_fc = Linear(width, w_h, bias=bias)
        self.h_act = build_activation(act)
        self.dropout = M.Dropout(dropout) if dropout > 0 else None
        self.fc = Linear(w_h, num_classes, bias=bias)

    def forward(self, x):
        x = self.avg_pool(self.act(self.bn(self.conv(x))))
        if self.se is not None:
            x = self.se(x)
        x = self.h_act(self.h_fc(F.flatten(x, 1)))
        if self.dropout is not None:
            x = self.dropout(x)
        return self.fc(x)


class VGGHead(M.Module):
    """VGG head: adaptive average pool to 7x7 (any input size), [fc, act, dropout] x2, fc."""

    def __init__(self, w_in, num_classes, act="relu", width=4096, dropout=0.5):
        super().__init__()
        self.avg_pool = AdaptiveAvgPool2d(7)
        self.classifier = M.Sequential(
            Linear(w_in * 7 * 7, width), build_activation(act), M.Dropout(dropout),
            Linear(width, width), build_activation(act), M.Dropout(dropout),
            Linear(width, num_classes),
        )

    def forward(self, x):
        return self.classifier(F.flatten(self.avg_pool(x), 1))
