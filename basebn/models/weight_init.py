"""Every family's weight initialisation, and zero-init of the last norm in residual branches.

* :func:`init_weights` (the basecls-style families; pycls / basecls ``init_weights``): conv N(0, sqrt(2 / fan_out))
  with fan_out = out_channels / groups * kh * kw, conv bias U(+-1/sqrt(fan_in)); norm weight 1, bias 0;
  linear N(0, 0.01), bias 0.
* :func:`init_weights_torchvision` (basebn's ResNets): conv MSRA normal (fan_out, relu); linear
  U(+-1/sqrt(in_features)), bias 0; norms keep their construction values (1, 0).
* :func:`init_weights_wrn` (the wide ResNets, as their reference code): conv N(0, sqrt(2 / (kh*kw*out))),
  linear bias 0 (weight: MegEngine's default); norms keep 1, 0.

A residual block marks its last norm by a ``last_norm()`` method (None when the block has no residual
branch ending in a norm); :func:`zero_init_last_norms` sets those gammas to 0 (``zero_init_residual``).
"""
import math

import megengine.module as M

from ..layers.norm import is_norm

__all__ = ["init_weights", "init_weights_torchvision", "init_weights_wrn", "zero_init_last_norms", "last_norms"]


def _conv_fans(weight):
    shape = weight.shape[1:] if weight.ndim == 5 else weight.shape  # grouped: (G, O/G, I/G, kh, kw)
    receptive = shape[2] * shape[3]
    return shape[1] * receptive, shape[0] * receptive


def init_weights(model):
    """Initialise every conv, norm and linear layer of `model` in place (see module docstring)."""
    for m in model.modules():
        if isinstance(m, M.Conv2d):
            fan_in, fan_out = _conv_fans(m.weight)
            M.init.normal_(m.weight, 0.0, math.sqrt(2.0 / fan_out))
            if m.bias is not None:
                bound = 1.0 / math.sqrt(fan_in)
                M.init.uniform_(m.bias, -bound, bound)
        elif is_norm(m) and getattr(m, "weight", None) is not None:
            M.init.ones_(m.weight)
            M.init.zeros_(m.bias)
        elif isinstance(m, M.Linear):
            M.init.normal_(m.weight, 0.0, 0.01)
            if m.bias is not None:
                M.init.zeros_(m.bias)


def init_weights_torchvision(model):
    """torchvision's ResNet initialisation of every conv and linear layer of `model`, in place (module docstring)."""
    for m in model.modules():
        if isinstance(m, M.Conv2d):
            M.init.msra_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, M.Linear):
            bound = 1 / math.sqrt(m.in_features)
            M.init.uniform_(m.weight, -bound, bound)
            M.init.zeros_(m.bias)


def init_weights_wrn(model):
    """The wide-ResNet reference initialisation of every conv and linear layer of `model`, in place."""
    for m in model.modules():
        if isinstance(m, M.Conv2d):
            k = m.weight.shape[-2] * m.weight.shape[-1]
            M.init.normal_(m.weight, 0.0, math.sqrt(2.0 / (k * m.out_channels)))
        elif isinstance(m, M.Linear):
            M.init.zeros_(m.bias)


def last_norms(model):
    """The last norm layer of every residual block of `model` (blocks with a ``last_norm()`` method)."""
    norms = []
    for m in model.modules():
        last = getattr(m, "last_norm", None)
        if callable(last) and last() is not None:
            norms.append(last())
    return norms


def zero_init_last_norms(model):
    """Set gamma of each residual block's last norm to 0: every block starts as identity (Goyal et al. 2017)."""
    for norm in last_norms(model):
        if getattr(norm, "weight", None) is not None:
            M.init.zeros_(norm.weight)
