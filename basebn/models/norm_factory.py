"""The norm-layer factory every family uses: build_norm(kind) with the family's BN defaults filled in."""
from functools import partial

from ..layers.norm import build_norm

__all__ = ["norm_factory"]


def norm_factory(norm, bn_momentum=None, bn_eps=None, default_momentum=0.9, default_eps=1e-5):
    """`channels -> norm module` for kind `norm` ("BN", "SyncBN", "FrozenBN", "GN", "BRN", "SyncBRN").

    None for `bn_momentum` / `bn_eps` means the family default. Momentum is MegEngine's convention
    (running = m * running + (1 - m) * batch): PyTorch's momentum 0.01 is 0.99 here.
    """
    momentum = default_momentum if bn_momentum is None else bn_momentum
    eps = default_eps if bn_eps is None else bn_eps
    return partial(build_norm, norm, momentum=momentum, eps=eps)
