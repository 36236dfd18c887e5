"""VGG-BN key names: timm (``features.{i}`` conv with bias, ``features.{i+1}`` BN, ``pre_logits.fc1/fc2``
7x7 / 1x1 convs, ``head.fc``) -> basecls (``s1.b1.0`` conv, ``s1.b1.1`` BN, ``head.classifier.0/3/6``).

Exact maps: each conv bias is folded into the following BN's running mean (mean - bias; batch statistics
absorb a constant shift in training too); fc1's (4096, 512, 7, 7) is the Linear (4096, 512 * 49) over the
flattened 7x7 map. Logits equal timm's for inputs up to 224 px (both pool adaptively to 7x7 there); above
224 px timm slides fc1 over the larger map and averages, basecls pools to 7x7 first.
"""
import numpy as np

from ..vgg import VGG_DEPTHS

__all__ = ["timm_vgg_to_basecls"]

_HEAD = {"pre_logits.fc1": "head.classifier.0", "pre_logits.fc2": "head.classifier.3", "head.fc": "head.classifier.6"}


def timm_vgg_to_basecls(state, arch):
    """timm vgg*_bn keys -> basecls's for `arch` (a key of VGG_DEPTHS); unknown keys kept for the fit check."""
    blocks = [(s + 1, b + 1) for s, depth in enumerate(VGG_DEPTHS[arch]) for b in range(depth)]
    convs = sorted({int(k.split(".")[1]) for k, v in state.items() if k.startswith("features.") and np.ndim(v) == 4})
    names = {}
    for (stage, block), index in zip(blocks, convs):
        names[f"features.{index}"] = f"s{stage}.b{block}.0"
        names[f"features.{index + 1}"] = f"s{stage}.b{block}.1"
    names.update(_HEAD)
    out, biases = {}, {}
    for key, value in state.items():
        prefix, _, leaf = key.rpartition(".")
        new = names.get(prefix)
        if new is None:
            out[key] = value
        elif new.endswith(".0") and new.startswith("s") and leaf == "bias":
            biases[new[:-2]] = np.asarray(value)  # the conv bias, folded below
        elif new.startswith("head.") and leaf == "weight":
            out[f"{new}.weight"] = np.asarray(value).reshape(np.shape(value)[0], -1)  # conv fc -> Linear
        else:
            out[f"{new}.{leaf}"] = value
    for block, bias in biases.items():
        mean = f"{block}.1.running_mean"
        if mean in out:
            out[mean] = np.asarray(out[mean]) - bias
        else:  # no BN to fold it into: kept, for the fit check to report
            out[f"{block}.0.bias"] = bias
    return out
