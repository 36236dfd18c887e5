"""VGG with BatchNorm (vgg11_bn .. vgg19_bn), basecls's module names (``s1.b1.0`` conv, ``s1.b1.1`` norm).

The head pools to 7x7 with PyTorch's adaptive bins, so inputs smaller than 224 (down to 32) work. Each block's BN
carries the activation when both have a fused form (:func:`~basebn.layers.bn_act.norm_then_act`: ``s1.b1.2`` is
then an ``Identity``; same state dict).
"""
import megengine.module as M

from ..layers.bn_act import norm_then_act
from ..layers.conv_norm_act import padded_conv
from ..layers.max_pool import MaxPool2d
from .heads import VGGHead
from .norm_factory import norm_factory
from .weight_init import init_weights

__all__ = ["VGGStage", "VGG", "VGG_DEPTHS", "build_vgg"]


class VGGStage(M.Module):
    """`depth` blocks ``b1..bN`` of [3x3 conv, norm, act], then a 2x2/2 max pool."""

    def __init__(self, w_in, w_out, depth, norm_layer, act):
        super().__init__()
        self.depth = depth
        for i in range(depth):
            bn, act_module = norm_then_act(norm_layer(w_out), act)
            setattr(self, f"b{i + 1}", M.Sequential(padded_conv(w_in, w_out, 3), bn, act_module))
            w_in = w_out
        self.max_pool = MaxPool2d(kernel_size=2, stride=2)

    def forward(self, x):
        for i in range(self.depth):
            x = getattr(self, f"b{i + 1}")(x)
        return self.max_pool(x)


class VGG(M.Module):
    """Five VGGStages (64, 128, 256, 512, 512 wide) -> VGGHead (`head_width`-wide fcs, dropout)."""

    def __init__(self, depths, widths=(64, 128, 256, 512, 512), head_width=4096, dropout=0.5, num_classes=1000,
                 in_channels=3, norm="BN", bn_momentum=None, bn_eps=None, act="relu"):
        super().__init__()
        norm_layer = norm_factory(norm, bn_momentum, bn_eps)
        self.depths = list(depths)
        prev_w = in_channels
        for i, (d, w) in enumerate(zip(depths, widths)):
            setattr(self, f"s{i + 1}", VGGStage(prev_w, w, d, norm_layer, act))
            prev_w = w
        self.head = VGGHead(prev_w, num_classes, act, width=head_width, dropout=dropout)
        init_weights(self)

    def features(self, x):
        for i in range(len(self.depths)):
            x = getattr(self, f"s{i + 1}")(x)
        return x

    def forward(self, x):
        return self.head(self.features(x))


VGG_DEPTHS = {
    "vgg11_bn": [1, 1, 2, 2, 2],
    "vgg13_bn": [2, 2, 2, 2, 2],
    "vgg16_bn": [2, 2, 3, 3, 3],
    "vgg19_bn": [2, 2, 4, 4, 4],
}


def build_vgg(name, **kw):
    """The VGG-BN `name` (a key of VGG_DEPTHS)."""
    return VGG(VGG_DEPTHS[name], **kw)
