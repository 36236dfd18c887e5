"""Weights of other libraries -> basebn state dicts: timm (PyTorch) and basecls (MegEngine) name maps.

timm families mapped (one module each): ResNet/-D/ResNeXt/SE (resnet_names), RegNetX/Y, MobileNetV2 and
EfficientNet(-Lite) (effnet_names), RepVGG, VGG-BN, HRNet; the others are refused in dispatch with why.
``convert_timm(state, arch, family, own_shapes, source)`` / ``convert_basecls(...)`` pick the family's
name map (a free function in a per-family module), then :func:`~.layout.fit_state` converts layouts to the
model's shapes and checks every key and shape (one CheckpointError listing what does not fit).
"""
from .dispatch import FOREIGN_FORMATS, convert_basecls, convert_timm
from .layout import fit_state

__all__ = ["FOREIGN_FORMATS", "convert_timm", "convert_basecls", "fit_state"]
