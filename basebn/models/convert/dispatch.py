"""Which name map a foreign checkpoint needs, by basebn family and name; families without one are refused.

A refusal names the architectural difference (or that the source library has no such model), so a user
never gets a model that loads but computes something else.
"""
import re

from ...checkpoint import CheckpointError
from .effnet_names import timm_effnet_to_basecls
from .hrnet_names import timm_hrnet_to_basecls
from .layout import fit_state
from .regnet_names import timm_regnet_to_basecls
from .repvgg_names import timm_repvgg_to_basecls
from .resnet_names import basecls_resnet_to_torchvision, timm_resnet_to_basecls
from .vgg_names import timm_vgg_to_basecls

__all__ = ["FOREIGN_FORMATS", "TIMM_UNSUPPORTED", "convert_timm", "convert_basecls"]

FOREIGN_FORMATS = ("timm", "basecls")

# family -> why timm weights are refused
TIMM_UNSUPPORTED = {
    "cifar_resnet": "timm has no CIFAR ResNets",
    "wide_resnet": "timm has no pre-activation CIFAR wide ResNets",
    "mbnetv1": "timm has no MobileNetV1 of basecls's layout",
    "snetv2": "timm has no ShuffleNetV2",
    "snetv2p": "timm has no ShuffleNetV2+",
    "mbnetv3": "timm's MobileNetV3 differs from basecls's (SE widths: 2.73 M vs 2.75 M parameters for the "
               "large x0.75) and is not mapped",
    "effnetv2": "timm's EfficientNetV2 B0-B3/S/M/L are TensorFlow ports (tf_efficientnetv2_*: 'SAME' padding, "
                "BN eps 1e-3) and are not mapped",
}
_RESNET_D = re.compile(r"^resnet\d+d$")


def convert_timm(state, arch, family, own_shapes, source, classifier_keys=()):
    """timm `state` (PyTorch layout, {key: array}) -> basebn model `arch`'s state (family `family`);
    `classifier_keys` may differ in shape (see fit_state)."""
    if family in TIMM_UNSUPPORTED:
        raise CheckpointError(f"{source}: timm weights for {arch} (family {family}) are not supported: "
                              f"{TIMM_UNSUPPORTED[family]}; use basecls or basebn weights")
    if family == "resnet_basecls":
        if arch.startswith("wide_resnet"):
            raise CheckpointError(f"{source}: timm's {arch} has dense 3x3 convs (68.9 M parameters for "
                                  f"wide_resnet50_2); basecls's (and basebn's) {arch} has 2-group 3x3 convs: "
                                  f"the architectures differ, use basecls weights")
        state = timm_resnet_to_basecls(state, deep_stem=bool(_RESNET_D.match(arch)))
    elif family in ("regnetx", "regnety"):
        state = timm_regnet_to_basecls(state)
    elif family == "hrnet":
        state = timm_hrnet_to_basecls(state)
    elif family in ("mbnetv2", "effnet", "effnet_lite"):
        state = timm_effnet_to_basecls(state)
    elif family == "repvgg":
        state = timm_repvgg_to_basecls(state)
    elif family == "vgg_bn":
        state = timm_vgg_to_basecls(state, arch)
    # family "resnet" (basebn's resnet18/34/50) has torchvision/timm names already
    return fit_state(state, own_shapes, source, classifier_keys)


def convert_basecls(state, arch, family, own_shapes, source, classifier_keys=()):
    """basecls `state` (MegEngine layout) -> basebn model `arch`'s state: the same keys except basebn's own
    torchvision-named resnet18/34/50."""
    if family in ("cifar_resnet", "wide_resnet"):
        raise CheckpointError(f"{source}: basecls has no {family} models; {arch} takes basebn weights")
    if family == "resnet":
        state = basecls_resnet_to_torchvision(state)
    return fit_state(state, own_shapes, source, classifier_keys)
