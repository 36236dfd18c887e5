"""RegNetX / RegNetY (Radosavovic et al. 2020) with basecls's names, widths and module names.

Per-stage widths and depths come from the (w0, wa, wm, depth) parametrisation (:func:`generate_regnet`),
made compatible with the group width (:func:`adjust_block_compatibility`). RegNetY adds SE (ratio 0.25
of the block *input* width) after the grouped 3x3 conv. The stem's and each block's a / b BNs carry the activation,
and c_bn the residual add and activation (nothing sits between; SE is in the b branch), when they have a fused
form (:func:`~basebn.layers.bn_act.norm_then_act`; same names and state dict).
"""
import numpy as np

from ..layers.bn_act import has_act, norm_then_act
from ..layers.conv_norm_act import padded_conv
from ..layers.se import SqueezeExcite, se_width
from .anynet import AnyNet, SimpleStem, _Shortcut

__all__ = ["RegBottleneckBlock", "RegNet", "generate_regnet", "adjust_block_compatibility", "REGNET_PARAMS",
           "build_regnet"]


class RegBottleneckBlock(_Shortcut):
    """x + f(x), f = [1x1, norm, act], [3x3 grouped (stride), norm, act], [SE], [1x1, norm]; then act."""

    def __init__(self, w_in, w_out, stride, norm_layer, act="relu", bot_mul=1.0, group_w=8, se_r=0.0, **unused):
        super().__init__()
        self._init_shortcut(w_in, w_out, stride, norm_layer, avg_down=False)
        w_b = int(round(w_out * bot_mul))
        w_se = se_width(w_in, se_r, "round")
        self.a, (self.a_bn, self.a_act) = padded_conv(w_in, w_b, 1), norm_then_act(norm_layer(w_b), act)
        self.b = padded_conv(w_b, w_b, 3, stride=stride, groups=w_b // group_w)
        self.b_bn, self.b_act = norm_then_act(norm_layer(w_b), act)
        self.se = SqueezeExcite(w_b, w_se, act) if w_se > 0 else None
        self.c = padded_conv(w_b, w_out, 1)
        self.c_bn, self.act = norm_then_act(norm_layer(w_out), act)  # SE is before c: c_bn -> add -> act always

    def last_norm(self):
        return self.c_bn

    def forward(self, x):
        x, x_p = self.conv_and_shortcut(self.a, x)
        x = self.a_act(self.a_bn(x))
        x = self.b_act(self.b_bn(self.b(x)))
        if self.se is not None:
            x = self.se(x)
        if has_act(self.c_bn):  # fused: c_bn adds the shortcut and applies the activation
            return self.c_bn(self.c(x), x_p)
        return self.act(self.c_bn(self.c(x)) + x_p)


def generate_regnet(w_a, w_0, w_m, depth, q=8):
    """(stage widths, stage depths) from RegNet's linear-then-quantised per-block widths."""
    if not (w_a >= 0 and w_0 > 0 and w_m > 1 and w_0 % q == 0):
        raise ValueError(f"bad RegNet parameters wa={w_a} w0={w_0} wm={w_m}")
    ws_cont = np.arange(depth) * w_a + w_0
    ks = np.round(np.log(ws_cont / w_0) / np.log(w_m))
    ws_all = np.round(w_0 * np.power(w_m, ks) / q).astype(int) * q
    ws, ds = np.unique(ws_all, return_counts=True)
    return ws.tolist(), ds.tolist()


def adjust_block_compatibility(ws, bs, gs):
    """Widths, bottleneck multipliers and group widths adjusted so every bottleneck width divides into groups."""
    vs = [int(max(1, w * b)) for w, b in zip(ws, bs)]
    gs = [int(min(g, v)) for g, v in zip(gs, vs)]
    ms = [np.lcm(g, int(b)) if b > 1 else g for g, b in zip(gs, bs)]
    vs = [max(m, int(round(v / m) * m)) for v, m in zip(vs, ms)]
    ws = [int(v / b) for v, b in zip(vs, bs)]
    return ws, bs, gs


class RegNet(AnyNet):
    """RegNet from (depth, w0, wa, wm, group_w); 32-wide 3x3/2 stem, every stage stride 2."""

    def __init__(self, depth, w0, wa, wm, group_w, se_r=0.0, bot_mul=1.0, stem_w=32, **kw):
        widths, depths = generate_regnet(wa, w0, wm, depth)
        n = len(widths)
        widths, bot_muls, group_ws = adjust_block_compatibility(widths, [bot_mul] * n, [group_w] * n)
        super().__init__(SimpleStem, stem_w, RegBottleneckBlock, depths, widths, [2] * n,
                         bot_muls=bot_muls, group_ws=group_ws, se_r=se_r, **kw)


# name: (depth, w0, wa, wm, group_w), from basecls / pycls
REGNET_PARAMS = {
    "regnetx_002": (13, 24, 36.44, 2.49, 8),
    "regnetx_004": (22, 24, 24.48, 2.54, 16),
    "regnetx_006": (16, 48, 36.97, 2.24, 24),
    "regnetx_008": (16, 56, 35.73, 2.28, 16),
    "regnetx_016": (18, 80, 34.01, 2.25, 24),
    "regnetx_032": (25, 88, 26.31, 2.25, 48),
    "regnetx_040": (23, 96, 38.65, 2.43, 40),
    "regnetx_064": (17, 184, 60.83, 2.07, 56),
    "regnetx_080": (23, 80, 49.56, 2.88, 120),
    "regnetx_120": (19, 168, 73.36, 2.37, 112),
    "regnetx_160": (22, 216, 55.59, 2.1, 128),
    "regnetx_320": (23, 320, 69.86, 2.0, 168),
    "regnety_002": (13, 24, 36.44, 2.49, 8),
    "regnety_004": (16, 48, 27.89, 2.09, 8),
    "regnety_006": (15, 48, 32.54, 2.32, 16),
    "regnety_008": (14, 56, 38.84, 2.4, 16),
    "regnety_016": (27, 48, 20.71, 2.65, 24),
    "regnety_032": (21, 80, 42.63, 2.66, 24),
    "regnety_040": (22, 96, 31.41, 2.24, 64),
    "regnety_064": (25, 112, 33.22, 2.27, 72),
    "regnety_080": (17, 192, 76.82, 2.19, 56),
    "regnety_120": (19, 168, 73.36, 2.37, 112),
    "regnety_160": (18, 200, 106.23, 2.48, 112),
    "regnety_320": (20, 232, 115.89, 2.53, 232),
}
REGNETY_SE_RATIO = 0.25


def build_regnet(name, **kw):
    """The RegNet `name` (a key of REGNET_PARAMS); RegNetY names get SE."""
    depth, w0, wa, wm, group_w = REGNET_PARAMS[name]
    if name.startswith("regnety"):
        kw.setdefault("se_r", REGNETY_SE_RATIO)
    return RegNet(depth, w0, wa, wm, group_w, **kw)

