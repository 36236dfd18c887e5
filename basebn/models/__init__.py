"""Model architectures. MODEL_TABLE is the one explicit table of names (basecls's names where shared):
name -> (constructor, family, default input size). No registry, no import side effects.

``build_model(name, num_classes=1000, in_channels=3, **kw)``; every constructor also takes ``norm``
("BN", "SyncBN", "FrozenBN", "GN"), ``bn_momentum`` / ``bn_eps`` (None: the family's default, filled in by
:func:`~basebn.models.norm_factory.norm_factory` and nowhere else) and family kwargs. ``model_info(name)``
gives family and default input size. RESNET_FAMILIES and ZERO_INIT_FAMILIES say which families take the
ResNet-only kwargs and ``zero_init_residual``.
"""
import numbers
from functools import partial
from typing import Any, Dict, List, Optional

import megengine.module as M

from . import resnet_family
from .cifar_resnet import resnet44, resnet110
from .effnet import build_effnet
from .hrnet import build_hrnet
from .mbnet import build_mbnet
from .regnet import build_regnet
from .repvgg import build_repvgg, reparameterize
from .resnet import ResNet, resnet18, resnet20, resnet32, resnet34, resnet50, resnet56
from .snet import build_snet
from .vgg import build_vgg
from .weights import load_weights, read_weights
from .wide_resnet import wrn_16_8, wrn_28_10, wrn_40_4

__all__ = ["MODEL_TABLE", "MODELS", "RESNET_FAMILIES", "ZERO_INIT_FAMILIES", "build_model", "list_models",
           "model_info", "reparameterize", "ResNet", "load_weights", "read_weights"]


def _rows(build, family, names, size=224):
    """MODEL_TABLE rows ``name: (partial(build, name), family, input size)`` for `names`: a list (all of
    input size `size`), or a ``{name: input size}`` dict."""
    sizes = names if isinstance(names, dict) else dict.fromkeys(names, size)
    return {name: (partial(build, name), family, s) for name, s in sizes.items()}


# name: (constructor, family, default input size)
MODEL_TABLE = {
    # basebn's ResNets (torchvision key names: conv1, layer1.0.conv1, fc)
    "resnet20": (resnet20, "cifar_resnet", 32),
    "resnet32": (resnet32, "cifar_resnet", 32),
    "resnet44": (resnet44, "cifar_resnet", 32),
    "resnet56": (resnet56, "cifar_resnet", 32),
    "resnet110": (resnet110, "cifar_resnet", 32),
    "resnet18": (resnet18, "resnet", 224),
    "resnet34": (resnet34, "resnet", 224),
    "resnet50": (resnet50, "resnet", 224),
    # pre-activation wide ResNets for 32 px inputs
    "wrn_16_8": (wrn_16_8, "wide_resnet", 32),
    "wrn_28_10": (wrn_28_10, "wide_resnet", 32),
    "wrn_40_4": (wrn_40_4, "wide_resnet", 32),
    # basecls's ResNet variants (basecls key names: stem, s1.b1.a, head.fc), one constructor each
    **{name: (getattr(resnet_family, name), "resnet_basecls", 224) for name in (
        "resnet101", "resnet152", "resnet18d", "resnet34d", "resnet50d", "resnet101d", "resnet152d",
        "resnext50_32x4d", "resnext101_32x4d", "resnext101_32x8d", "resnext101_64x4d", "resnext152_32x4d",
        "resnext152_32x8d", "resnext152_64x4d", "se_resnet18", "se_resnet34", "se_resnet50", "se_resnet101",
        "se_resnet152", "se_resnext50_32x4d", "se_resnext101_32x4d", "se_resnext101_32x8d", "se_resnext101_64x4d",
        "se_resnext152_32x4d", "se_resnext152_32x8d", "se_resnext152_64x4d", "wide_resnet50_2", "wide_resnet101_2")},
    # RegNet
    **_rows(build_regnet, "regnetx", [f"regnetx_{mf}" for mf in (
        "002", "004", "006", "008", "016", "032", "040", "064", "080", "120", "160", "320")]),
    **_rows(build_regnet, "regnety", [f"regnety_{mf}" for mf in (
        "002", "004", "006", "008", "016", "032", "040", "064", "080", "120", "160", "320")]),
    # MobileNet
    **_rows(build_mbnet, "mbnetv1", ["mbnetv1_x025", "mbnetv1_x050", "mbnetv1_x075", "mbnetv1_x100"]),
    **_rows(build_mbnet, "mbnetv2", ["mbnetv2_x035", "mbnetv2_x050", "mbnetv2_x075", "mbnetv2_x100", "mbnetv2_x140"]),
    **_rows(build_mbnet, "mbnetv3", ["mbnetv3_small_x075", "mbnetv3_small_x100", "mbnetv3_large_x075",
                                     "mbnetv3_large_x100"]),
    # EfficientNet (input sizes: basecls's test sizes)
    **_rows(build_effnet, "effnet", {"effnet_b0": 224, "effnet_b1": 240, "effnet_b2": 260, "effnet_b3": 300,
                                     "effnet_b4": 380, "effnet_b5": 456, "effnet_b6": 528, "effnet_b7": 600,
                                     "effnet_b8": 672}),
    **_rows(build_effnet, "effnet_lite", {"effnet_b0_lite": 224, "effnet_b1_lite": 240, "effnet_b2_lite": 260,
                                          "effnet_b3_lite": 280, "effnet_b4_lite": 300}),
    **_rows(build_effnet, "effnetv2", {"effnetv2_b0": 224, "effnetv2_b1": 240, "effnetv2_b2": 260,
                                       "effnetv2_b3": 300, "effnetv2_s": 384, "effnetv2_m": 480, "effnetv2_l": 480}),
    # ShuffleNetV2 / V2+
    **_rows(build_snet, "snetv2", ["snetv2_x050", "snetv2_x100", "snetv2_x150", "snetv2_x200"]),
    **_rows(build_snet, "snetv2p", ["snetv2p_x075", "snetv2p_x100", "snetv2p_x125"]),
    # RepVGG (basebn.models.reparameterize folds the branches for deploy)
    **_rows(build_repvgg, "repvgg", ["repvgg_a0", "repvgg_a1", "repvgg_a2", "repvgg_b0", "repvgg_b1", "repvgg_b1g2",
                                     "repvgg_b1g4", "repvgg_b2", "repvgg_b2g2", "repvgg_b2g4", "repvgg_b3",
                                     "repvgg_b3g2", "repvgg_b3g4"]),
    **_rows(build_repvgg, "repvgg", {"repvgg_d2": 320}),
    # VGG with BN
    **_rows(build_vgg, "vgg_bn", ["vgg11_bn", "vgg13_bn", "vgg16_bn", "vgg19_bn"]),
    # HRNet (basecls's classification HRNets)
    **_rows(build_hrnet, "hrnet", ["hrnet_w18_small_v1", "hrnet_w18_small_v2", "hrnet_w18", "hrnet_w30", "hrnet_w32",
                                   "hrnet_w40", "hrnet_w44", "hrnet_w48", "hrnet_w64"]),
}
"""Every model name -> (constructor, family, default input size), in the order list_models gives."""

MODELS = {name: entry[0] for name, entry in MODEL_TABLE.items()}
"""Every model name -> its constructor (MODEL_TABLE's first column)."""

# families built by basebn's ResNet class: the only ones that take stem, stem_stride and base_width
RESNET_FAMILIES = ("cifar_resnet", "resnet")
"""The families built by basebn's ResNet class: the only ones that take stem, stem_stride and base_width."""
# families whose residual blocks end in a norm (``last_norm()``): the ones that take zero_init_residual
ZERO_INIT_FAMILIES = ("cifar_resnet", "resnet", "resnet_basecls", "regnetx", "regnety", "mbnetv2", "mbnetv3",
                      "effnet", "effnet_lite", "effnetv2", "hrnet")
"""The families whose residual blocks end in a norm (``last_norm()``): the ones that take zero_init_residual."""


def list_models(family: Optional[str] = None) -> List[str]:
    """Names build_model accepts, in table order (only `family`'s with one given).

    Args:
        family: a family name (MODEL_TABLE's second column, e.g. ``"regnetx"``); None: every family.

    Returns:
        The model names.
    """
    return [name for name, entry in MODEL_TABLE.items() if family is None or entry[1] == family]


def model_info(name: str) -> Dict[str, Any]:
    """The family and the default (test) input size of model `name`.

    Args:
        name: a key of MODEL_TABLE.

    Returns:
        ``dict(name=..., family=..., input_size=...)``.

    Raises:
        ValueError: `name` is not a model name.
    """
    _check_name(name)
    _, family, input_size = MODEL_TABLE[name]
    return dict(name=name, family=family, input_size=input_size)


def build_model(name: str, num_classes: int = 1000, in_channels: int = 3, **kwargs: Any) -> M.Module:
    """Build model `name` (a key of MODEL_TABLE).

    The model gets ``default_input_size`` (the table's), ``arch_name`` and ``arch_family`` attributes.

    Args:
        name: a key of MODEL_TABLE (see list_models).
        num_classes: outputs of the classifier.
        in_channels: channels of the input images.
        **kwargs: to the constructor: ``norm`` ("BN", "SyncBN", "FrozenBN", "GN", ...), ``bn_momentum``,
            ``bn_eps`` (None: the family's default) and the family's own keyword arguments.

    Returns:
        The model.

    Raises:
        ValueError: an unknown name, or num_classes / in_channels not a whole number >= 1.
    """
    _check_name(name)
    _check_count("num_classes", num_classes)
    _check_count("in_channels", in_channels)
    model = MODELS[name](num_classes=num_classes, in_channels=in_channels, **kwargs)
    model.default_input_size = MODEL_TABLE[name][2]
    model.arch_name, model.arch_family = name, MODEL_TABLE[name][1]  # for the timm:/basecls: name maps
    return model


def _check_count(key, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"build_model: {key} must be a whole number >= 1, got {value!r}")


def _check_name(name):
    if name not in MODEL_TABLE:
        raise ValueError(f"unknown model {name!r}: model.name must be one of {', '.join(sorted(MODEL_TABLE))}")
