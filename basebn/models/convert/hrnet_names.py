"""HRNet key names: timm (``layer1``, ``transition1``, ``stage2.0.branches``, ``fuse_layers``, ``incre_modules``,
``downsamp_modules``, ``final_layer``, ``classifier``) -> basecls (``stage1.module1.branch1``,
``stage2.transition``, ``fusion.fuse_{i}_{o}``, ``merge``, ``head``).

timm's final 1x1 conv has a bias, basecls's head conv none: the bias is folded into the following BN's
running mean (mean - bias), exact in eval and in training (batch statistics absorb a constant shift).
"""
import re

import numpy as np

__all__ = ["timm_hrnet_to_basecls"]

_RES_PART = {"conv1": "a", "conv2": "b", "conv3": "c", "bn1": "a_bn", "bn2": "b_bn", "bn3": "c_bn",
             "downsample.0": "proj", "downsample.1": "bn"}
_RULES = [  # (pattern on the prefix before .weight/.bias/..., function of the match -> basecls prefix)
    (r"conv([12])", lambda m: f"stem.conv_{m[1]}"),
    (r"bn([12])", lambda m: f"stem.norm_{m[1]}"),
    (r"layer1\.(\d+)\.(conv\d|bn\d|downsample\.\d)", lambda m: f"stage1.module1.branch1.block{int(m[1]) + 1}."
                                                                f"{_RES_PART[m[2]]}"),
    (r"transition(\d+)\.(\d+)\.([01])", lambda m: f"stage{int(m[1]) + 1}.transition.trans_{int(m[2]) + 1}."
                                                  f"{('conv_1', 'norm_1')[int(m[3])]}"),
    (r"transition(\d+)\.(\d+)\.(\d+)\.([01])", lambda m: f"stage{int(m[1]) + 1}.transition.trans_{int(m[2]) + 1}."
                                                         f"{('conv', 'norm')[int(m[4])]}_{int(m[3]) + 1}"),
    (r"stage(\d+)\.(\d+)\.branches\.(\d+)\.(\d+)\.(conv\d|bn\d|downsample\.\d)",
     lambda m: f"stage{m[1]}.module{int(m[2]) + 1}.branch{int(m[3]) + 1}.block{int(m[4]) + 1}.{_RES_PART[m[5]]}"),
    (r"stage(\d+)\.(\d+)\.fuse_layers\.(\d+)\.(\d+)\.([01])",  # up: conv, bn (then upsample)
     lambda m: f"stage{m[1]}.module{int(m[2]) + 1}.fusion.fuse_{int(m[4]) + 1}_{int(m[3]) + 1}."
               f"{('conv', 'norm')[int(m[5])]}_1"),
    (r"stage(\d+)\.(\d+)\.fuse_layers\.(\d+)\.(\d+)\.(\d+)\.([01])",  # down: k stride-2 conv, bn [, relu]
     lambda m: f"stage{m[1]}.module{int(m[2]) + 1}.fusion.fuse_{int(m[4]) + 1}_{int(m[3]) + 1}."
               f"{('conv', 'norm')[int(m[6])]}_{int(m[5]) + 1}"),
    (r"incre_modules\.(\d+)\.0\.(conv\d|bn\d|downsample\.\d)", lambda m: f"merge.branch{int(m[1]) + 1}."
                                                                         f"{_RES_PART[m[2]]}"),
    (r"downsamp_modules\.(\d+)\.([01])", lambda m: f"merge.dnsample{int(m[1]) + 1}.{('conv', 'norm')[int(m[2])]}"),
    (r"final_layer\.([01])", lambda m: f"head.{('conv', 'bn')[int(m[1])]}"),
    (r"classifier", lambda m: "head.fc"),
]
_COMPILED = [(re.compile(f"^{pattern}$"), rename) for pattern, rename in _RULES]


def _rename(prefix):
    for pattern, rename in _COMPILED:
        m = pattern.match(prefix)
        if m:
            return rename(m)
    return None


def timm_hrnet_to_basecls(state):
    """timm HRNet keys -> basecls's (unknown keys kept), the final conv's bias folded into its BN."""
    out = {}
    for key, value in state.items():
        prefix, _, leaf = key.rpartition(".")
        new = _rename(prefix)
        out[f"{new}.{leaf}" if new else key] = value
    bias = out.pop("head.conv.bias", None)
    if bias is not None and "head.bn.running_mean" in out:
        out["head.bn.running_mean"] = np.asarray(out["head.bn.running_mean"]) - np.asarray(bias)
    return out
