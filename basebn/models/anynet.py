"""AnyNet: stem -> stages s1..sN of residual blocks -> head, the pycls / basecls network layout.

Module names follow basecls (``stem.conv``, ``s1.b1.a``, ``s1.b1.a_bn``, ``s2.b1.proj``,
``s2.b1.bn``, ``head.fc``) so basecls checkpoints map key for key. RegNet builds on it
(:mod:`basebn.models.regnet`); the ResNet variants are in :mod:`basebn.models.resnet_family`.
The ResNet stems and blocks fuse each BN with the activation after it, and a block's last BN with the residual
add and activation (:mod:`basebn.layers.bn_act`; same names and state dict) when the norm and activation have a
fused form and nothing (SE, drop path) sits between; the activation module is then an ``Identity``.
"""
from numbers import Real

import megengine.module as M

from ..layers.bn_act import has_act, norm_then_act
from ..layers.conv import conv_and_identity
from ..layers.conv_norm_act import ConvNormAct, padded_conv
from ..layers.drop_path import DropPath
from ..layers.max_pool import MaxPool2d
from ..layers.se import SqueezeExcite, se_width
from .heads import ClsHead
from .norm_factory import norm_factory
from .weight_init import init_weights, zero_init_last_norms

__all__ = ["ResStem", "ResDeepStem", "SimpleStem", "ResBasicBlock", "ResBottleneckBlock", "AnyStage", "AnyNet",
           "linear_drop_path_probs"]


class ResStem(M.Module):
    """ResNet stem: 7x7/2 conv, norm, act, 3x3/2 max pool."""

    def __init__(self, w_in, w_out, norm_layer, act):
        super().__init__()
        self.conv = padded_conv(w_in, w_out, 7, stride=2)
        self.bn, self.act = norm_then_act(norm_layer(w_out), act)
        self.pool = MaxPool2d(3, stride=2, padding=1)

    def forward(self, x):
        return self.pool(self.act(self.bn(self.conv(x))))


class ResDeepStem(M.Module):
    """ResNet-D stem: three 3x3 convs (the first /2, w_out/2 wide), each with norm and act, 3x3/2 max pool."""

    def __init__(self, w_in, w_out, norm_layer, act):
        super().__init__()
        w_b = w_out // 2
        self.a, (self.a_bn, self.a_act) = padded_conv(w_in, w_b, 3, stride=2), norm_then_act(norm_layer(w_b), act)
        self.b, (self.b_bn, self.b_act) = padded_conv(w_b, w_b, 3), norm_then_act(norm_layer(w_b), act)
        self.c, (self.c_bn, self.c_act) = padded_conv(w_b, w_out, 3), norm_then_act(norm_layer(w_out), act)
        self.pool = MaxPool2d(3, stride=2, padding=1)

    def forward(self, x):
        x = self.a_act(self.a_bn(self.a(x)))
        x = self.b_act(self.b_bn(self.b(x)))
        x = self.c_act(self.c_bn(self.c(x)))
        return self.pool(x)


class SimpleStem(ConvNormAct):
    """3x3/2 conv, norm, act (RegNet, MobileNet, EfficientNet, ShuffleNetV2)."""

    def __init__(self, w_in, w_out, norm_layer, act):
        super().__init__(w_in, w_out, 3, norm_layer, act, stride=2)


class _Shortcut(M.Module):
    """Mixin: ``pool`` (ResNet-D avg-down), ``proj`` (1x1 conv) and ``bn`` when shape changes, else identity."""

    def _init_shortcut(self, w_in, w_out, stride, norm_layer, avg_down):
        self.pool = self.proj = self.bn = None
        if w_in != w_out or stride > 1:
            if avg_down and stride > 1:
                self.pool = M.AvgPool2d(2, stride)
                self.proj = padded_conv(w_in, w_out, 1)
            else:
                self.proj = padded_conv(w_in, w_out, 1, stride=stride)
            self.bn = norm_layer(w_out)

    def conv_and_shortcut(self, conv, x):
        """``(conv(x), shortcut(x))``; the shortcut's gradient w.r.t. x (identity or projection) is summed inside
        the conv's data-gradient op (:func:`~basebn.layers.conv.conv_and_identity`)."""
        out, x = conv_and_identity(conv, x)
        return out, self.shortcut(x)

    def shortcut(self, x):
        if self.pool is not None:
            x = self.pool(x)
        if self.proj is not None:
            x = self.bn(self.proj(x))
        return x


class ResBasicBlock(_Shortcut):
    """x + f(x), f = [3x3 conv, norm, act], [3x3 conv, norm], [SE]; then act."""

    def __init__(self, w_in, w_out, stride, norm_layer, act="relu", bot_mul=1.0, se_r=0.0, avg_down=False,
                 drop_path_prob=0.0, **unused):
        super().__init__()
        self._init_shortcut(w_in, w_out, stride, norm_layer, avg_down)
        w_b = round(w_out * bot_mul)
        w_se = se_width(w_out, se_r, "divisible")
        self.a, (self.a_bn, self.a_act) = padded_conv(w_in, w_b, 3, stride=stride), norm_then_act(norm_layer(w_b), act)
        self.b = padded_conv(w_b, w_out, 3)
        self.se = SqueezeExcite(w_out, w_se, act) if w_se > 0 else None
        self.drop_path = DropPath(drop_path_prob)
        self.b_bn, self.act = norm_then_act(norm_layer(w_out), act, fuse=self.se is None and not drop_path_prob)

    def last_norm(self):
        return self.b_bn

    def forward(self, x):
        x, x_p = self.conv_and_shortcut(self.a, x)
        x = self.a_act(self.a_bn(x))
        if has_act(self.b_bn):  # fused: b_bn adds the shortcut and applies the activation
            return self.b_bn(self.b(x), x_p)
        x = self.b_bn(self.b(x))
        if self.se is not None:
            x = self.se(x)
        return self.act(self.drop_path(x) + x_p)


class ResBottleneckBlock(_Shortcut):
    """x + f(x), f = [1x1, norm, act], [3x3 (stride, groups), norm, act], [1x1, norm], [SE]; then act."""

    def __init__(self, w_in, w_out, stride, norm_layer, act="relu", bot_mul=0.25, group_w=None, se_r=0.0,
                 avg_down=False, drop_path_prob=0.0, **unused):
        super().__init__()
        self._init_shortcut(w_in, w_out, stride, norm_layer, avg_down)
        w_b = round(w_out * bot_mul)
        groups = w_b // group_w if group_w else 1
        w_se = se_width(w_out, se_r, "divisible")
        self.a, (self.a_bn, self.a_act) = padded_conv(w_in, w_b, 1), norm_then_act(norm_layer(w_b), act)
        self.b = padded_conv(w_b, w_b, 3, stride=stride, groups=groups)
        self.b_bn, self.b_act = norm_then_act(norm_layer(w_b), act)
        self.c = padded_conv(w_b, w_out, 1)
        self.se = SqueezeExcite(w_out, w_se, act) if w_se > 0 else None
        self.drop_path = DropPath(drop_path_prob)
        self.c_bn, self.act = norm_then_act(norm_layer(w_out), act, fuse=self.se is None and not drop_path_prob)

    def last_norm(self):
        return self.c_bn

    def forward(self, x):
        x, x_p = self.conv_and_shortcut(self.a, x)
        x = self.a_act(self.a_bn(x))
        x = self.b_act(self.b_bn(self.b(x)))
        if has_act(self.c_bn):  # fused: c_bn adds the shortcut and applies the activation
            return self.c_bn(self.c(x), x_p)
        x = self.c_bn(self.c(x))
        if self.se is not None:
            x = self.se(x)
        return self.act(self.drop_path(x) + x_p)


class AnyStage(M.Module):
    """`depth` blocks ``b1..bN`` of one width; the first has the stage's stride. `block_kwargs[i]` go to block i."""

    def __init__(self, w_in, w_out, stride, depth, block, block_kwargs):
        super().__init__()
        self.depth = depth
        for i in range(depth):
            setattr(self, f"b{i + 1}", block(w_in, w_out, stride, **block_kwargs[i]))
            stride, w_in = 1, w_out

    def __len__(self):
        return self.depth

    def forward(self, x):
        for i in range(self.depth):
            x = getattr(self, f"b{i + 1}")(x)
        return x


def linear_drop_path_probs(depths, drop_path_prob):
    """Per-stage lists of per-block drop-path probabilities rising linearly from 0 (block i of all: i/total*p)."""
    total, probs, i = sum(depths), [], 0
    for d in depths:
        probs.append([(i + j) / total * drop_path_prob for j in range(d)])
        i += d
    return probs


def _per_stage(value, n):
    return [value] * n if value is None or isinstance(value, Real) else list(value)


class StagedNet(M.Module):
    """stem -> s1..sN -> head, the layout basecls's families share; subclasses build the parts and set depths."""

    def initialize(self, zero_init_residual):
        """basecls's initialisation, then (optionally) each residual block's last norm gamma at 0."""
        init_weights(self)
        if zero_init_residual:
            zero_init_last_norms(self)

    def features(self, x):
        """The last stage's feature map."""
        x = self.stem(x)
        for i in range(len(self.depths)):
            x = getattr(self, f"s{i + 1}")(x)
        return x

    def forward(self, x):
        return self.head(self.features(x))


class AnyNet(StagedNet):
    """stem -> stages -> ClsHead. Widths are block output widths; `bot_muls` / `group_ws` set bottleneck
    width and group width per stage; `zero_init_residual` zeroes each block's last norm gamma."""

    default_bn_momentum, default_bn_eps = 0.9, 1e-5

    def __init__(self, stem, stem_w, block, depths, widths, strides, bot_muls=1.0, group_ws=None, se_r=0.0,
                 avg_down=False, drop_path_prob=0.0, zero_init_residual=False, num_classes=1000, in_channels=3,
                 norm="BN", bn_momentum=None, bn_eps=None, act="relu", head_width=0, dropout=0.0):
        super().__init__()
        norm_layer = norm_factory(norm, bn_momentum, bn_eps, self.default_bn_momentum, self.default_bn_eps)
        self.depths = list(depths)
        self.stem = stem(in_channels, stem_w, norm_layer, act)
        n = len(depths)
        stage_args = zip(depths, widths, strides, _per_stage(bot_muls, n), _per_stage(group_ws, n),
                         linear_drop_path_probs(depths, drop_path_prob))
        prev_w = stem_w
        for i, (d, w, s, b, g, dp) in enumerate(stage_args):
            kwargs = [dict(norm_layer=norm_layer, act=act, bot_mul=b, group_w=g, se_r=se_r, avg_down=avg_down,
                           drop_path_prob=p) for p in dp]
            setattr(self, f"s{i + 1}", AnyStage(prev_w, w, s, d, block, kwargs))
            prev_w = w
        self.head = ClsHead(prev_w, num_classes, norm_layer, act, width=head_width, dropout=dropout)
        self.initialize(zero_init_residual)
