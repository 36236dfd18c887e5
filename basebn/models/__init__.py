"""Model architectures. MODEL_TABLE is the one explicit table of names (basecls's names where shared):
name -> (constructor, family, default input size). No registry, no import side effects.

``build_model(name, num_classes=1000, in_channels=3, **kw)``; every constructor also takes ``norm``
("BN", "SyncBN", "FrozenBN", "GN"), ``bn_momentum`` / ``bn_eps`` (None: the family's default) and
family kwargs. ``model_info(name)`` gives family and default input size.
"""
from functools import partial

from .cifar_resnet import resnet44, resnet110
from .effnet import build_effnet
from .hrnet import build_hrnet
from .mbnet import build_mbnet
from .regnet import build_regnet
from .repvgg import build_repvgg, reparameterize
from .resnet import ResNet, resnet18, resnet20, resnet32, resnet34, resnet50, resnet56
from .resnet_family import (
    resnet18d, resnet34d, resnet50d, resnet101, resnet101d, resnet152, resnet152d,
    resnext50_32x4d, resnext101_32x4d, resnext101_32x8d, resnext101_64x4d, resnext152_32x4d, resnext152_32x8d,
    resnext152_64x4d, se_resnet18, se_resnet34, se_resnet50, se_resnet101, se_resnet152, se_resnext50_32x4d,
    se_resnext101_32x4d, se_resnext101_32x8d, se_resnext101_64x4d, se_resnext152_32x4d, se_resnext152_32x8d,
    se_resnext152_64x4d, wide_resnet50_2, wide_resnet101_2,
)
from .snet import build_snet
from .vgg import build_vgg
from .weights import load_weights, read_weights
from .wide_resnet import wrn_16_8, wrn_28_10, wrn_40_4

__all__ = ["MODEL_TABLE", "MODELS", "build_model", "list_models", "model_info", "reparameterize", "ResNet",
           "load_weights", "read_weights"]

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
    # basecls's ResNet variants (basecls key names: stem, s1.b1.a, head.fc)
    "resnet101": (resnet101, "resnet_basecls", 224),
    "resnet152": (resnet152, "resnet_basecls", 224),
    "resnet18d": (resnet18d, "resnet_basecls", 224),
    "resnet34d": (resnet34d, "resnet_basecls", 224),
    "resnet50d": (resnet50d, "resnet_basecls", 224),
    "resnet101d": (resnet101d, "resnet_basecls", 224),
    "resnet152d": (resnet152d, "resnet_basecls", 224),
    "resnext50_32x4d": (resnext50_32x4d, "resnet_basecls", 224),
    "resnext101_32x4d": (resnext101_32x4d, "resnet_basecls", 224),
    "resnext101_32x8d": (resnext101_32x8d, "resnet_basecls", 224),
    "resnext101_64x4d": (resnext101_64x4d, "resnet_basecls", 224),
    "resnext152_32x4d": (resnext152_32x4d, "resnet_basecls", 224),
    "resnext152_32x8d": (resnext152_32x8d, "resnet_basecls", 224),
    "resnext152_64x4d": (resnext152_64x4d, "resnet_basecls", 224),
    "se_resnet18": (se_resnet18, "resnet_basecls", 224),
    "se_resnet34": (se_resnet34, "resnet_basecls", 224),
    "se_resnet50": (se_resnet50, "resnet_basecls", 224),
    "se_resnet101": (se_resnet101, "resnet_basecls", 224),
    "se_resnet152": (se_resnet152, "resnet_basecls", 224),
    "se_resnext50_32x4d": (se_resnext50_32x4d, "resnet_basecls", 224),
    "se_resnext101_32x4d": (se_resnext101_32x4d, "resnet_basecls", 224),
    "se_resnext101_32x8d": (se_resnext101_32x8d, "resnet_basecls", 224),
    "se_resnext101_64x4d": (se_resnext101_64x4d, "resnet_basecls", 224),
    "se_resnext152_32x4d": (se_resnext152_32x4d, "resnet_basecls", 224),
    "se_resnext152_32x8d": (se_resnext152_32x8d, "resnet_basecls", 224),
    "se_resnext152_64x4d": (se_resnext152_64x4d, "resnet_basecls", 224),
    "wide_resnet50_2": (wide_resnet50_2, "resnet_basecls", 224),
    "wide_resnet101_2": (wide_resnet101_2, "resnet_basecls", 224),
    # RegNet
    "regnetx_002": (partial(build_regnet, "regnetx_002"), "regnetx", 224),
    "regnetx_004": (partial(build_regnet, "regnetx_004"), "regnetx", 224),
    "regnetx_006": (partial(build_regnet, "regnetx_006"), "regnetx", 224),
    "regnetx_008": (partial(build_regnet, "regnetx_008"), "regnetx", 224),
    "regnetx_016": (partial(build_regnet, "regnetx_016"), "regnetx", 224),
    "regnetx_032": (partial(build_regnet, "regnetx_032"), "regnetx", 224),
    "regnetx_040": (partial(build_regnet, "regnetx_040"), "regnetx", 224),
    "regnetx_064": (partial(build_regnet, "regnetx_064"), "regnetx", 224),
    "regnetx_080": (partial(build_regnet, "regnetx_080"), "regnetx", 224),
    "regnetx_120": (partial(build_regnet, "regnetx_120"), "regnetx", 224),
    "regnetx_160": (partial(build_regnet, "regnetx_160"), "regnetx", 224),
    "regnetx_320": (partial(build_regnet, "regnetx_320"), "regnetx", 224),
    "regnety_002": (partial(build_regnet, "regnety_002"), "regnety", 224),
    "regnety_004": (partial(build_regnet, "regnety_004"), "regnety", 224),
    "regnety_006": (partial(build_regnet, "regnety_006"), "regnety", 224),
    "regnety_008": (partial(build_regnet, "regnety_008"), "regnety", 224),
    "regnety_016": (partial(build_regnet, "regnety_016"), "regnety", 224),
    "regnety_032": (partial(build_regnet, "regnety_032"), "regnety", 224),
    "regnety_040": (partial(build_regnet, "regnety_040"), "regnety", 224),
    "regnety_064": (partial(build_regnet, "regnety_064"), "regnety", 224),
    "regnety_080": (partial(build_regnet, "regnety_080"), "regnety", 224),
    "regnety_120": (partial(build_regnet, "regnety_120"), "regnety", 224),
    "regnety_160": (partial(build_regnet, "regnety_160"), "regnety", 224),
    "regnety_320": (partial(build_regnet, "regnety_320"), "regnety", 224),
    # MobileNet
    "mbnetv1_x025": (partial(build_mbnet, "mbnetv1_x025"), "mbnetv1", 224),
    "mbnetv1_x050": (partial(build_mbnet, "mbnetv1_x050"), "mbnetv1", 224),
    "mbnetv1_x075": (partial(build_mbnet, "mbnetv1_x075"), "mbnetv1", 224),
    "mbnetv1_x100": (partial(build_mbnet, "mbnetv1_x100"), "mbnetv1", 224),
    "mbnetv2_x035": (partial(build_mbnet, "mbnetv2_x035"), "mbnetv2", 224),
    "mbnetv2_x050": (partial(build_mbnet, "mbnetv2_x050"), "mbnetv2", 224),
    "mbnetv2_x075": (partial(build_mbnet, "mbnetv2_x075"), "mbnetv2", 224),
    "mbnetv2_x100": (partial(build_mbnet, "mbnetv2_x100"), "mbnetv2", 224),
    "mbnetv2_x140": (partial(build_mbnet, "mbnetv2_x140"), "mbnetv2", 224),
    "mbnetv3_small_x075": (partial(build_mbnet, "mbnetv3_small_x075"), "mbnetv3", 224),
    "mbnetv3_small_x100": (partial(build_mbnet, "mbnetv3_small_x100"), "mbnetv3", 224),
    "mbnetv3_large_x075": (partial(build_mbnet, "mbnetv3_large_x075"), "mbnetv3", 224),
    "mbnetv3_large_x100": (partial(build_mbnet, "mbnetv3_large_x100"), "mbnetv3", 224),
    # EfficientNet (input sizes: basecls's test sizes)
    "effnet_b0": (partial(build_effnet, "effnet_b0"), "effnet", 224),
    "effnet_b1": (partial(build_effnet, "effnet_b1"), "effnet", 240),
    "effnet_b2": (partial(build_effnet, "effnet_b2"), "effnet", 260),
    "effnet_b3": (partial(build_effnet, "effnet_b3"), "effnet", 300),
    "effnet_b4": (partial(build_effnet, "effnet_b4"), "effnet", 380),
    "effnet_b5": (partial(build_effnet, "effnet_b5"), "effnet", 456),
    "effnet_b6": (partial(build_effnet, "effnet_b6"), "effnet", 528),
    "effnet_b7": (partial(build_effnet, "effnet_b7"), "effnet", 600),
    "effnet_b8": (partial(build_effnet, "effnet_b8"), "effnet", 672),
    "effnet_b0_lite": (partial(build_effnet, "effnet_b0_lite"), "effnet_lite", 224),
    "effnet_b1_lite": (partial(build_effnet, "effnet_b1_lite"), "effnet_lite", 240),
    "effnet_b2_lite": (partial(build_effnet, "effnet_b2_lite"), "effnet_lite", 260),
    "effnet_b3_lite": (partial(build_effnet, "effnet_b3_lite"), "effnet_lite", 280),
    "effnet_b4_lite": (partial(build_effnet, "effnet_b4_lite"), "effnet_lite", 300),
    "effnetv2_b0": (partial(build_effnet, "effnetv2_b0"), "effnetv2", 224),
    "effnetv2_b1": (partial(build_effnet, "effnetv2_b1"), "effnetv2", 240),
    "effnetv2_b2": (partial(build_effnet, "effnetv2_b2"), "effnetv2", 260),
    "effnetv2_b3": (partial(build_effnet, "effnetv2_b3"), "effnetv2", 300),
    "effnetv2_s": (partial(build_effnet, "effnetv2_s"), "effnetv2", 384),
    "effnetv2_m": (partial(build_effnet, "effnetv2_m"), "effnetv2", 480),
    "effnetv2_l": (partial(build_effnet, "effnetv2_l"), "effnetv2", 480),
    # ShuffleNetV2 / V2+
    "snetv2_x050": (partial(build_snet, "snetv2_x050"), "snetv2", 224),
    "snetv2_x100": (partial(build_snet, "snetv2_x100"), "snetv2", 224),
    "snetv2_x150": (partial(build_snet, "snetv2_x150"), "snetv2", 224),
    "snetv2_x200": (partial(build_snet, "snetv2_x200"), "snetv2", 224),
    "snetv2p_x075": (partial(build_snet, "snetv2p_x075"), "snetv2p", 224),
    "snetv2p_x100": (partial(build_snet, "snetv2p_x100"), "snetv2p", 224),
    "snetv2p_x125": (partial(build_snet, "snetv2p_x125"), "snetv2p", 224),
    # RepVGG (basebn.models.reparameterize folds the branches for deploy)
    "repvgg_a0": (partial(build_repvgg, "repvgg_a0"), "repvgg", 224),
    "repvgg_a1": (partial(build_repvgg, "repvgg_a1"), "repvgg", 224),
    "repvgg_a2": (partial(build_repvgg, "repvgg_a2"), "repvgg", 224),
    "repvgg_b0": (partial(build_repvgg, "repvgg_b0"), "repvgg", 224),
    "repvgg_b1": (partial(build_repvgg, "repvgg_b1"), "repvgg", 224),
    "repvgg_b1g2": (partial(build_repvgg, "repvgg_b1g2"), "repvgg", 224),
    "repvgg_b1g4": (partial(build_repvgg, "repvgg_b1g4"), "repvgg", 224),
    "repvgg_b2": (partial(build_repvgg, "repvgg_b2"), "repvgg", 224),
    "repvgg_b2g2": (partial(build_repvgg, "repvgg_b2g2"), "repvgg", 224),
    "repvgg_b2g4": (partial(build_repvgg, "repvgg_b2g4"), "repvgg", 224),
    "repvgg_b3": (partial(build_repvgg, "repvgg_b3"), "repvgg", 224),
    "repvgg_b3g2": (partial(build_repvgg, "repvgg_b3g2"), "repvgg", 224),
    "repvgg_b3g4": (partial(build_repvgg, "repvgg_b3g4"), "repvgg", 224),
    "repvgg_d2": (partial(build_repvgg, "repvgg_d2"), "repvgg", 320),
    # VGG with BN
    "vgg11_bn": (partial(build_vgg, "vgg11_bn"), "vgg_bn", 224),
    "vgg13_bn": (partial(build_vgg, "vgg13_bn"), "vgg_bn", 224),
    "vgg16_bn": (partial(build_vgg, "vgg16_bn"), "vgg_bn", 224),
    "vgg19_bn": (partial(build_vgg, "vgg19_bn"), "vgg_bn", 224),
    # HRNet (basecls's classification HRNets)
    **{name: (partial(build_hrnet, name), "hrnet", 224) for name in (
        "hrnet_w18_small_v1", "hrnet_w18_small_v2", "hrnet_w18", "hrnet_w30", "hrnet_w32", "hrnet_w40", "hrnet_w44",
        "hrnet_w48", "hrnet_w64")},
}

MODELS = {name: entry[0] for name, entry in MODEL_TABLE.items()}

# the BN-kwarg names build_model drops when None, so constructors with fixed defaults keep theirs
_OPTIONAL_BN_KWARGS = ("bn_momentum", "bn_eps")


def list_models(family=None):
    """Names build_model accepts, in table order (only `family`'s with one given)."""
    return [name for name, entry in MODEL_TABLE.items() if family is None or entry[1] == family]


def model_info(name):
    """``dict(name, family, input_size)``: the family and the default (test) input size of model `name`."""
    _check_name(name)
    _, family, input_size = MODEL_TABLE[name]
    return dict(name=name, family=family, input_size=input_size)


def build_model(name, num_classes=1000, in_channels=3, **kwargs):
    """Build model `name` (a key of MODEL_TABLE); kwargs go to the constructor (norm, bn_momentum, ...).

    The model gets ``default_input_size`` (the table's), ``arch_name`` and ``arch_family`` attributes.
    """
    _check_name(name)
    kwargs = {k: v for k, v in kwargs.items() if not (k in _OPTIONAL_BN_KWARGS and v is None)}
    model = MODELS[name](num_classes=num_classes, in_channels=in_channels, **kwargs)
    model.default_input_size = MODEL_TABLE[name][2]
    model.arch_name, model.arch_family = name, MODEL_TABLE[name][1]  # for the timm:/basecls: name maps
    return model


def _check_name(name):
    if name not in MODEL_TABLE:
        raise ValueError(f"unknown model {name!r}: model.name must be one of {', '.join(sorted(MODEL_TABLE))}")
