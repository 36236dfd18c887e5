"""Activation modules by basecls's names: :func:`build_activation` ("relu", "relu6", "silu"/"swish", "hswish", ...).

The modules hold no parameters except PReLU's, so swapping one never changes a state dict.
"""
from typing import Callable, Optional, Union

import megengine.functional as F
import megengine.module as M

__all__ = ["HSigmoid", "HSwish", "PassThrough", "ReLU6", "Swish", "ACTIVATIONS", "build_activation"]


class PassThrough(M.Identity):
    """An ``M.Identity`` that returns its input itself, as PyTorch's ``nn.Identity`` does.

    MegEngine's ``Identity`` runs a ``Copy`` op, and autodiff a second one in the backward: two dispatched ops
    per call for nothing, in every activation slot a fused BN-activation layer leaves empty.
    """

    def forward(self, x):
        return x


class HSigmoid(M.Module):
    """Hard sigmoid: relu6(x + 3) / 6."""

    def forward(self, x):
        return F.hsigmoid(x)


class HSwish(M.Module):
    """Hard swish: x * relu6(x + 3) / 6 (MobileNetV3)."""

    def forward(self, x):
        return F.hswish(x)


class ReLU6(M.Module):
    """min(max(x, 0), 6) (MobileNetV2)."""

    def forward(self, x):
        return F.relu6(x)


class Swish(M.Module):
    """x * sigmoid(x), also called SiLU (EfficientNet)."""

    def forward(self, x):
        return F.silu(x)


ACTIVATIONS = {
    "relu": M.ReLU,
    "relu6": ReLU6,
    "silu": Swish,
    "swish": Swish,
    "hswish": HSwish,
    "hsigmoid": HSigmoid,
    "sigmoid": M.Sigmoid,
    "gelu": M.GELU,
    "leaky_relu": M.LeakyReLU,
    "prelu": M.PReLU,
}
"""Activation name (basecls's) -> module class; build_activation builds one."""


def build_activation(name: Optional[Union[str, Callable[[], M.Module]]]) -> M.Module:
    """A new activation module for `name`.

    Args:
        name: a key of ACTIVATIONS; None gives :class:`PassThrough`; a callable is called.

    Returns:
        The module.

    Raises:
        ValueError: an unknown name.
    """
    if name is None:
        return PassThrough()
    if callable(name):
        return name()
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}: use one of {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]()
