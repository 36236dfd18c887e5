"""RepVGG key names: timm's byobnet layout (``stem.conv_kxk.conv``, ``stages.{i}.{j}.conv_1x1.bn``,
``stages.{i}.{j}.identity``, ``head.fc``) -> basecls (``stage0.rbr_dense.conv``, ``stage{i+1}.{j}.rbr_1x1.bn``,
``stage{i+1}.{j}.rbr_identity``, ``head.fc``). Both sum the 3x3, 1x1 and identity-BN branches, then ReLU.
"""
import re

__all__ = ["timm_repvgg_to_basecls"]

_BRANCH = {"conv_kxk": "rbr_dense", "conv_1x1": "rbr_1x1", "identity": "rbr_identity"}
_STEM = re.compile(r"^stem\.(conv_kxk|conv_1x1|identity)\.(.+)$")
_STAGE = re.compile(r"^stages\.(\d+)\.(\d+)\.(conv_kxk|conv_1x1|identity)\.(.+)$")


def timm_repvgg_to_basecls(state):
    """timm repvgg_* keys -> basecls's (unknown keys kept)."""
    out = {}
    for key, value in state.items():
        m = _STEM.match(key)
        if m:
            key = f"stage0.{_BRANCH[m[1]]}.{m[2]}"
        m = _STAGE.match(key)
        if m:
            key = f"stage{int(m[1]) + 1}.{m[2]}.{_BRANCH[m[3]]}.{m[4]}"
        out[key] = value
    return out
