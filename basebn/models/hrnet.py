"""HRNet for classification (Wang et al. 2019), basecls's names, layout and state-dict keys.

Stem (two 3x3/2 conv-norm-act) -> stages of parallel branches of ResNet blocks joined by fusion layers
(stride-2 3x3 convs down, 1x1 conv + nearest upsample up) -> merge (one bottleneck per branch, 3x3/2
down-samples summed from fine to coarse) -> ClsHead (1x1 conv to 2048, pool, fc). Keys: ``stem.conv_1``,
``stage2.transition.trans_2.conv_1``, ``stage3.module1.branch1.block1.a``, ``stage3.module1.fusion.fuse_2_1``,
``merge.dnsample1.conv``, ``head.fc``. The blocks are :mod:`basebn.models.anynet`'s, like basecls's. Every
norm followed by its own activation (stem, transitions, fusion down-paths, merge down-samples, the blocks' BNs and
residual adds) carries it when both have a fused form (:func:`~basebn.layers.bn_act.norm_then_act`; the ``act_*``
slot holds an ``Identity``); the sums of several scales in a fusion layer run their activation unfused.
"""
from collections import OrderedDict

import megengine.functional as F
import megengine.module as M

from ..layers.activation import build_activation
from ..layers.bn_act import norm_then_act
from ..layers.conv_norm_act import padded_conv
from .anynet import ResBasicBlock, ResBottleneckBlock
from .heads import ClsHead
from .norm_factory import norm_factory
from .weight_init import init_weights, zero_init_last_norms

__all__ = ["UpsampleNearest", "HRFusion", "HRModule", "HRTrans", "HRStage", "HRMerge", "HRNet", "HRNET_SPECS",
           "build_hrnet"]

# block name -> output width multiplier (the bottleneck expands 4x)
OUT_MUL = {"basic": 1, "bottleneck": 4}


def hr_block(block_name, w_in, w_out, norm_layer, act):
    """basecls's HRNet block: a stride-1 ResBasicBlock (w_out wide) or ResBottleneckBlock (w_out -> 4 w_out)."""
    if block_name == "basic":
        return ResBasicBlock(w_in, w_out, 1, norm_layer, act)
    return ResBottleneckBlock(w_in, 4 * w_out, 1, norm_layer, act, bot_mul=0.25, group_w=w_out)


def _sequential(layers):
    """An M.Sequential whose children carry the given names (basecls's ``conv_1``, ``norm_1``, ``act_1``)."""
    return M.Sequential(OrderedDict(layers))


def _norm_act(norm_name, act_name, norm, act):
    """[(norm_name, norm), (act_name, act module)] with the activation fused into the norm where it can be
    (:func:`~basebn.layers.bn_act.norm_then_act`; the act slot is then an ``Identity``)."""
    norm, act = norm_then_act(norm, act)
    return [(norm_name, norm), (act_name, act)]


class UpsampleNearest(M.Module):
    """Nearest-neighbour upsampling by an integer factor (repeat rows and columns)."""

    def __init__(self, scale_factor):
        super().__init__()
        self.scale_factor = scale_factor

    def forward(self, x):
        return F.repeat(F.repeat(x, self.scale_factor, axis=2), self.scale_factor, axis=3)


class HRFusion(M.Module):
    """Every output scale o sums every input scale i brought to it (``fuse_{i}_{o}``, 1-based), then act."""

    def __init__(self, channels, multi_scale_output, norm_layer, act):
        super().__init__()
        self.multi_scale_output = multi_scale_output
        n = len(channels)
        for f_o in range(n if multi_scale_output else 1):
            for f_i in range(n):
                layer = None
                if f_i < f_o:  # down: f_o - f_i stride-2 3x3 convs, act between them
                    layers, steps = [], f_o - f_i
                    for i in range(steps):
                        w_out = channels[f_i if i < steps - 1 else f_o]
                        layers.append((f"conv_{i + 1}", padded_conv(channels[f_i], w_out, 3, stride=2)))
                        if i < steps - 1:
                            layers += _norm_act(f"norm_{i + 1}", f"act_{i + 1}", norm_layer(w_out), act)
                        else:  # summed with the other scales before the activation
                            layers.append((f"norm_{i + 1}", norm_layer(w_out)))
                    layer = _sequential(layers)
                elif f_i > f_o:  # up: 1x1 conv, norm, nearest upsample
                    layer = _sequential([("conv_1", padded_conv(channels[f_i], channels[f_o], 1)),
                                         ("norm_1", norm_layer(channels[f_o])),
                                         ("upsample_1", UpsampleNearest(2 ** (f_i - f_o)))])
                setattr(self, f"fuse_{f_i + 1}_{f_o + 1}", layer)
        self.act = build_activation(act)

    def forward(self, x_list):
        out = []
        for f_o in range(len(x_list) if self.multi_scale_output else 1):
            total = None
            for f_i, x in enumerate(x_list):
                layer = getattr(self, f"fuse_{f_i + 1}_{f_o + 1}", None)
                if layer is not None:
                    x = layer(x)
                total = x if total is None else total + x
            out.append(self.act(total))
        return out


class HRModule(M.Module):
    """Parallel branches ``branch1..N`` (num_blocks[i] blocks each), then an HRFusion when N > 1."""

    def __init__(self, block_name, num_blocks, in_channels, channels, multi_scale_output, norm_layer, act):
        super().__init__()
        mul = OUT_MUL[block_name]
        for i, (w_in, w_out, depth) in enumerate(zip(in_channels, channels, num_blocks)):
            blocks = [(f"block{j + 1}", hr_block(block_name, w_out * mul if j else w_in, w_out, norm_layer, act))
                      for j in range(depth)]
            setattr(self, f"branch{i + 1}", _sequential(blocks))
        self.num_branches = len(channels)
        self.fusion = None
        if len(channels) > 1:
            self.fusion = HRFusion([mul * c for c in channels], multi_scale_output, norm_layer, act)

    def forward(self, x_list):
        x_list = [getattr(self, f"branch{i + 1}")(x) for i, x in enumerate(x_list)]
        return self.fusion(x_list) if self.fusion is not None else x_list


class HRTrans(M.Module):
    """Adapts the previous stage's scales to this stage's: 3x3 conv where widths differ, a new coarser scale
    from the last one by stride-2 3x3 convs (``trans_{i}``, None where the scale passes unchanged)."""

    def __init__(self, in_chs, out_chs, norm_layer, act):
        super().__init__()
        n_in = len(in_chs)
        self.num_trans = len(out_chs)
        for t_o, c_out in enumerate(out_chs):
            layer = None
            if t_o < n_in and in_chs[t_o] != c_out:
                layer = _sequential([("conv_1", padded_conv(in_chs[t_o], c_out, 3)),
                                     *_norm_act("norm_1", "act_1", norm_layer(c_out), act)])
            elif t_o >= n_in:
                layers = []
                for i in range(t_o - n_in + 1):
                    w_out = c_out if i == t_o - n_in else in_chs[-1]
                    layers += [(f"conv_{i + 1}", padded_conv(in_chs[-1], w_out, 3, stride=2)),
                               *_norm_act(f"norm_{i + 1}", f"act_{i + 1}", norm_layer(w_out), act)]
                layer = _sequential(layers)
            setattr(self, f"trans_{t_o + 1}", layer)

    def forward(self, x_list):
        x_list = x_list + [x_list[-1]] * (self.num_trans - len(x_list))
        out = []
        for t_o, x in enumerate(x_list):
            layer = getattr(self, f"trans_{t_o + 1}", None)
            out.append(layer(x) if layer is not None else x)
        return out


class HRStage(M.Module):
    """[HRTrans] then ``module1..N`` HRModules; the first stage (w_fst set) has no transition."""

    def __init__(self, num_modules, num_blocks, block_name, pre_channels, cur_channels, multi_scale_output,
                 w_fst, norm_layer, act):
        super().__init__()
        mid = [OUT_MUL[block_name] * c for c in cur_channels]
        self.transition = None if w_fst else HRTrans(pre_channels, mid, norm_layer, act)
        self.num_modules = num_modules
        for i in range(num_modules):
            setattr(self, f"module{i + 1}", HRModule(
                block_name, num_blocks, [w_fst] if w_fst and i == 0 else mid, cur_channels,
                multi_scale_output or i < num_modules - 1, norm_layer, act))

    def forward(self, x_list):
        if self.transition is not None:
            x_list = self.transition(x_list)
        for i in range(self.num_modules):
            x_list = getattr(self, f"module{i + 1}")(x_list)
        return x_list


class HRMerge(M.Module):
    """One block per scale (``branch{i}``), summed fine to coarse through ``dnsample{i}`` (3x3/2 conv with
    bias, norm, act)."""

    def __init__(self, block_name, pre_channels, channels, norm_layer, act):
        super().__init__()
        mul = OUT_MUL[block_name]
        for i, (w_in, w_out) in enumerate(zip(pre_channels, channels)):
            setattr(self, f"branch{i + 1}", hr_block(block_name, w_in, w_out, norm_layer, act))
        self.num_scales = len(channels)
        for i, (w_in, w_out) in enumerate(zip(channels[:-1], channels[1:])):
            setattr(self, f"dnsample{i + 1}", _sequential([
                ("conv", padded_conv(w_in * mul, w_out * mul, 3, stride=2, bias=True)),
                *_norm_act("norm", "act", norm_layer(w_out * mul), act)]))

    def forward(self, x_list):
        x = self.branch1(x_list[0])
        for i in range(len(x_list) - 1):
            x = getattr(self, f"dnsample{i + 1}")(x) + getattr(self, f"branch{i + 2}")(x_list[i + 1])
        return x


class HRNet(M.Module):
    """stem -> stage1..N -> merge -> ClsHead(head_width). Stage i has stage_modules[i] modules of
    stage_blocks[i] blocks per branch, branch widths stage_channels[i]."""

    default_bn_momentum, default_bn_eps = 0.9, 1e-5

    def __init__(self, stage_modules, stage_blocks, stage_channels, stage_block_names=("bottleneck", "basic", "basic",
                 "basic"), w_stem=64, multi_scale_output=True, merge_block_name="bottleneck",
                 merge_channels=(32, 64, 128, 256), head_width=2048, dropout=0.0, zero_init_residual=False,
                 num_classes=1000, in_channels=3, norm="BN", bn_momentum=None, bn_eps=None, act="relu"):
        super().__init__()
        norm_layer = norm_factory(norm, bn_momentum, bn_eps, self.default_bn_momentum, self.default_bn_eps)
        self.stem = _sequential([
            ("conv_1", padded_conv(in_channels, w_stem, 3, stride=2)),
            *_norm_act("norm_1", "act_1", norm_layer(w_stem), act),
            ("conv_2", padded_conv(w_stem, w_stem, 3, stride=2)),
            *_norm_act("norm_2", "act_2", norm_layer(w_stem), act)])
        self.num_stages = len(stage_modules)
        pre = []
        for i in range(self.num_stages):
            setattr(self, f"stage{i + 1}", HRStage(
                stage_modules[i], stage_blocks[i], stage_block_names[i], pre, stage_channels[i], multi_scale_output,
                None if i else w_stem, norm_layer, act))
            pre = [OUT_MUL[stage_block_names[i]] * c for c in stage_channels[i]]
        self.merge = HRMerge(merge_block_name, pre, list(merge_channels), norm_layer, act)
        w_merge = merge_channels[-1] * OUT_MUL[merge_block_name]
        self.head = ClsHead(w_merge, num_classes, norm_layer, act, width=head_width, dropout=dropout)
        init_weights(self)
        if zero_init_residual:
            zero_init_last_norms(self)

    def features(self, x):
        """The merged feature map (before the head)."""
        x_list = [self.stem(x)]
        for i in range(self.num_stages):
            x_list = getattr(self, f"stage{i + 1}")(x_list)
        return self.merge(x_list)

    def forward(self, x):
        return self.head(self.features(x))


_FULL = dict(stage_modules=[1, 1, 4, 3], stage_blocks=[[4], [4, 4], [4, 4, 4], [4, 4, 4, 4]])


def _widths(w):
    return [[64], [w, 2 * w], [w, 2 * w, 4 * w], [w, 2 * w, 4 * w, 8 * w]]


HRNET_SPECS = {
    "hrnet_w18_small_v1": dict(stage_modules=[1, 1, 1, 1], stage_blocks=[[1], [2, 2], [2, 2, 2], [2, 2, 2, 2]],
                               stage_channels=[[32], [16, 32], [16, 32, 64], [16, 32, 64, 128]]),
    "hrnet_w18_small_v2": dict(stage_modules=[1, 1, 3, 2], stage_blocks=[[2], [2, 2], [2, 2, 2], [2, 2, 2, 2]],
                               stage_channels=_widths(18)),
    **{f"hrnet_w{w}": dict(_FULL, stage_channels=_widths(w)) for w in (18, 30, 32, 40, 44, 48, 64)},
}


def build_hrnet(name, **kw):
    """The HRNet `name` (a key of HRNET_SPECS); kw override the spec or go to HRNet (num_classes, norm, ...)."""
    return HRNet(**{**HRNET_SPECS[name], **kw})
