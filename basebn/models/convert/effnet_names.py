"""MobileNetV2 / EfficientNet(-Lite) key names: timm's EfficientNet-builder layout (``conv_stem``, ``bn1``,
``blocks.{stage}.{block}.conv_pw/conv_dw/conv_pwl``, ``se.conv_reduce/conv_expand``, ``conv_head``, ``bn2``,
``classifier``) -> basecls (``stem.conv``, ``s{stage+1}.b{block+1}.exp/dwise/proj`` + ``_bn``, ``se.f_ex.0/2``,
``head.conv/bn/fc``).

A block with ``conv_pwl`` is an inverted residual (conv_pw is the expansion); without, a depthwise-separable
block (conv_pw is the projection). Only timm's plain ports (symmetric padding, BN eps 1e-5) equal basecls's:
the ``tf_*`` ports have the same keys but TensorFlow's 'SAME' padding and BN eps 1e-3.
"""
import re

__all__ = ["timm_effnet_to_basecls"]

_INVERTED = {"conv_pw": "exp", "bn1": "exp_bn", "conv_dw": "dwise", "bn2": "dwise_bn", "conv_pwl": "proj",
             "bn3": "proj_bn"}
_SEPARABLE = {"conv_dw": "dwise", "bn1": "dwise_bn", "conv_pw": "proj", "bn2": "proj_bn"}
_SE = {"se.conv_reduce": "se.f_ex.0", "se.conv_expand": "se.f_ex.2"}
_TOP = {"conv_stem": "stem.conv", "bn1": "stem.bn", "conv_head": "head.conv", "bn2": "head.bn",
        "classifier": "head.fc"}
_BLOCK = re.compile(r"^blocks\.(\d+)\.(\d+)\.(.+)\.(\w+)$")  # stage, block, part, leaf


def timm_effnet_to_basecls(state):
    """timm mobilenetv2_* / efficientnet_* / efficientnet_lite* keys -> basecls's (unknown keys kept)."""
    matches = {key: _BLOCK.match(key) for key in state}
    inverted = {m.group(1, 2) for m in matches.values() if m and m.group(3) == "conv_pwl"}
    out = {}
    for key, value in state.items():
        m, (prefix, _, leaf) = matches[key], key.rpartition(".")
        new = _TOP.get(prefix)
        if m:
            names = {**(_INVERTED if m.group(1, 2) in inverted else _SEPARABLE), **_SE}
            part = names.get(m.group(3))
            new = part and f"s{int(m.group(1)) + 1}.b{int(m.group(2)) + 1}.{part}"
            leaf = m.group(4)
        out[f"{new}.{leaf}" if new else key] = value
    return out
