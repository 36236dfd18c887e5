"""ResNet key names: torchvision/timm (``layer1.0.conv1``, ``downsample.0``, ``fc``) <-> basecls/AnyNet
(``s1.b1.a``, ``proj``, ``head.fc``).

timm's ResNet-D keeps an (identity or avg-pool) slot 0 in every ``downsample``, so its conv/BN are
``downsample.1`` / ``downsample.2``; its deep stem is ``conv1.0/1/3/4/6`` + ``bn1``. SE: timm ``se.fc1`` /
``se.fc2`` are basebn's ``se.f_ex.0`` / ``se.f_ex.2``.
"""
import re

__all__ = ["timm_resnet_to_basecls", "basecls_resnet_to_torchvision"]

_LETTERS = "abc"
_DEEP_STEM = {"conv1.0": "stem.a", "conv1.1": "stem.a_bn", "conv1.3": "stem.b", "conv1.4": "stem.b_bn",
              "conv1.6": "stem.c", "bn1": "stem.c_bn"}
_PLAIN_STEM = {"conv1": "stem.conv", "bn1": "stem.bn"}
_BLOCK = re.compile(r"^layer(\d+)\.(\d+)\.(.+)$")


def _block_part(part, deep):
    """timm's name inside a block -> basecls's."""
    m = re.match(r"^(conv|bn)(\d)\.(.+)$", part)
    if m:
        letter = _LETTERS[int(m.group(2)) - 1]
        return f"{letter}.{m.group(3)}" if m.group(1) == "conv" else f"{letter}_bn.{m.group(3)}"
    m = re.match(r"^downsample\.(\d)\.(.+)$", part)
    if m:
        slot = int(m.group(1)) - (1 if deep else 0)  # ResNet-D: slot 0 is the pool
        return f"{('proj', 'bn')[slot]}.{m.group(2)}" if slot in (0, 1) else None
    m = re.match(r"^se\.fc(\d)\.(.+)$", part)
    if m:
        return f"se.f_ex.{2 * (int(m.group(1)) - 1)}.{m.group(2)}"
    return None


def timm_resnet_to_basecls(state, deep_stem):
    """timm ResNet / ResNet-D / ResNeXt / SE-ResNet(Xt) keys -> basecls's AnyNet keys (unknown keys kept)."""
    stem = _DEEP_STEM if deep_stem else _PLAIN_STEM
    out = {}
    for key, value in state.items():
        new = key
        prefix, _, leaf = key.rpartition(".")
        m = _BLOCK.match(key)
        if prefix in stem:
            new = f"{stem[prefix]}.{leaf}"
        elif m:
            part = _block_part(m.group(3), deep_stem)
            if part is not None:
                new = f"s{m.group(1)}.b{int(m.group(2)) + 1}.{part}"
        elif prefix == "fc":
            new = f"head.fc.{leaf}"
        out[new] = value
    return out


_BASECLS_BLOCK = re.compile(r"^s(\d+)\.b(\d+)\.(a|b|c|a_bn|b_bn|c_bn|proj|bn)\.(\w+)$")
_BASECLS_PART = {"a": "conv1", "b": "conv2", "c": "conv3", "a_bn": "bn1", "b_bn": "bn2", "c_bn": "bn3",
                 "proj": "downsample.0", "bn": "downsample.1"}


def basecls_resnet_to_torchvision(state):
    """basecls's resnet18/34/50 keys -> basebn's own resnet18/34/50 (torchvision names)."""
    inverse_stem = {v: k for k, v in _PLAIN_STEM.items()}
    out = {}
    for key, value in state.items():
        new = key
        prefix, _, leaf = key.rpartition(".")
        m = _BASECLS_BLOCK.match(key)
        if prefix in inverse_stem:
            new = f"{inverse_stem[prefix]}.{leaf}"
        elif m:
            new = f"layer{m.group(1)}.{int(m.group(2)) - 1}.{_BASECLS_PART[m.group(3)]}.{m.group(4)}"
        elif prefix == "head.fc":
            new = f"fc.{leaf}"
        out[new] = value
    return out
