"""RegNetX/Y key names: timm (``s1.b1.conv1.conv``, ``conv1.bn``, ``downsample.conv``, ``se.fc1``) -> basecls
(``s1.b1.a``, ``a_bn``, ``proj`` / ``bn``, ``se.f_ex.0``). Stem (``stem.conv``, ``stem.bn``) and
``head.fc`` are named alike. timm's RegNet configs are pycls's, so the widths equal basecls's.
"""
import re

__all__ = ["timm_regnet_to_basecls"]

_PARTS = {"conv1.conv": "a", "conv1.bn": "a_bn", "conv2.conv": "b", "conv2.bn": "b_bn", "conv3.conv": "c",
          "conv3.bn": "c_bn", "downsample.conv": "proj", "downsample.bn": "bn", "se.fc1": "se.f_ex.0",
          "se.fc2": "se.f_ex.2"}
_BLOCK = re.compile(r"^(s\d+\.b\d+)\.(.+)\.(\w+)$")


def timm_regnet_to_basecls(state):
    """timm RegNetX/Y keys -> basecls's (unknown keys kept, for the fit check to name)."""
    out = {}
    for key, value in state.items():
        m = _BLOCK.match(key)
        if m and m.group(2) in _PARTS:
            key = f"{m.group(1)}.{_PARTS[m.group(2)]}.{m.group(3)}"
        out[key] = value
    return out
