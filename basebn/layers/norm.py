"""What a normalisation layer is: the BN / norm predicates every other module uses, and build_norm.

A BN layer is any subclass of MegEngine's ``_BatchNorm``: BatchNorm1d/2d (MegEngine's and basebn's,
a subclass of it), MegEngine's and basebn's SyncBatchNorm, FrozenBatchNorm2d, basebn's Batch Renormalization
layers (subclasses of BatchNorm2d / SyncBatchNorm). ``build_norm("BN")``
builds basebn's BatchNorm2d (the BN kernels).
"""
from typing import List, Optional, Tuple

import megengine.module as M
from megengine.module.batchnorm import _BatchNorm

from .batch_norm import BatchNorm2d, check_norm_batch_size
from .batch_renorm import BatchRenorm2d, SyncBatchRenorm
from .frozen_bn import FrozenBatchNorm2d
from .sync_bn import SyncBatchNorm

__all__ = [
    "NORM_KINDS",
    "OTHER_NORM_TYPES",
    "build_norm",
    "is_bn",
    "is_bn2d",
    "is_sync_bn",
    "is_frozen_bn",
    "is_norm",
    "has_running_stats",
    "uses_running_stats",
    "bn_layers",
    "set_norm_eval",
    "set_norm_batch_size",
]

NORM_KINDS = ("BN", "SyncBN", "FrozenBN", "GN", "BRN", "SyncBRN")
"""The kinds build_norm builds (``model.norm``)."""
OTHER_NORM_TYPES = (M.GroupNorm, M.InstanceNorm, M.LayerNorm)  # no running statistics
"""The normalisation layers without running statistics that is_norm counts."""


def is_bn(m: M.Module) -> bool:
    """A BatchNorm layer of any kind (BatchNorm1d/2d, SyncBatchNorm, FrozenBatchNorm2d).

    Args:
        m: any module.
    """
    return isinstance(m, _BatchNorm)


def is_bn2d(m: M.Module) -> bool:
    """A BN layer that can follow a Conv2d (every BN kind but BatchNorm1d).

    Args:
        m: any module.
    """
    return is_bn(m) and not isinstance(m, M.BatchNorm1d)


def is_sync_bn(m: M.Module) -> bool:
    """basebn's or MegEngine's SyncBatchNorm.

    Args:
        m: any module.
    """
    return isinstance(m, (SyncBatchNorm, M.SyncBatchNorm))


def is_frozen_bn(m: M.Module) -> bool:
    """A FrozenBatchNorm2d (fixed statistics and affine).

    Args:
        m: any module.
    """
    return isinstance(m, FrozenBatchNorm2d)


def is_norm(m: M.Module) -> bool:
    """Any normalisation layer: a BN layer, GroupNorm, InstanceNorm or LayerNorm.

    Args:
        m: any module.
    """
    return is_bn(m) or isinstance(m, OTHER_NORM_TYPES)


def has_running_stats(bn: M.Module) -> bool:
    """``bn`` holds running statistics and is set to track them.

    Args:
        bn: a norm layer.
    """
    return (getattr(bn, "running_mean", None) is not None and getattr(bn, "running_var", None) is not None
            and bool(getattr(bn, "track_running_stats", True)))


def uses_running_stats(bn: M.Module) -> bool:
    """``bn``'s forward normalises with its running statistics now (eval mode, ``freeze``, FrozenBN).

    Args:
        bn: a norm layer.
    """
    if is_frozen_bn(bn):
        return True
    if not has_running_stats(bn):
        return False
    return (not bn.training) or bool(getattr(bn, "freeze", False))


def bn_layers(model: M.Module) -> List[Tuple[str, M.Module]]:
    """Every BN layer of ``model`` (is_bn), in ``named_modules`` order.

    Args:
        model: the model.

    Returns:
        ``[(name, module)]``.
    """
    return [(name, m) for name, m in model.named_modules() if is_bn(m)]


def set_norm_eval(model: M.Module) -> None:
    """Put every BN layer of `model` (:func:`is_bn`) in eval mode (frozen statistics, mmdet's ``norm_eval``);
    the rest keeps its mode.

    Args:
        model: the model, usually just put in training mode.
    """
    for m in model.modules():
        if is_bn(m):
            m.eval()


def set_norm_batch_size(model: M.Module, size: Optional[int]) -> int:
    """Set the normalisation batch size (ghost BN) of every plain BatchNorm2d of `model` (not Batch
    Renormalization layers).

    Args:
        model: the model.
        size: samples per normalisation group, or None for the whole batch.

    Returns:
        How many layers took it.

    Raises:
        ValueError: `size` is neither None nor an integer >= 1.
    """
    size = check_norm_batch_size(size)
    layers = [m for m in model.modules() if isinstance(m, BatchNorm2d) and not isinstance(m, BatchRenorm2d)]
    for m in layers:
        m.norm_batch_size = size
    return len(layers)


def build_norm(kind: str, num_features: int, momentum: Optional[float] = 0.9, eps: float = 1e-5,
               gn_groups: int = 32) -> M.Module:
    """Return a 2D normalisation module of `kind` in NORM_KINDS for `num_features` channels.

    Args:
        kind: "BN", "SyncBN", "FrozenBN", "GN", "BRN" or "SyncBRN".
        num_features: channels.
        momentum: weight of the old running value (MegEngine's convention: PyTorch's 0.1 is 0.9 here); None:
            a cumulative average. Unused by FrozenBN and GN.
        eps: added to the variance.
        gn_groups: GN's group count, lowered to the largest that divides `num_features`.

    Returns:
        The norm module.

    Raises:
        ValueError: an unknown kind.
    """
    if kind == "BN":
        return BatchNorm2d(num_features, eps=eps, momentum=momentum)
    if kind == "SyncBN":
        return SyncBatchNorm(num_features, eps=eps, momentum=momentum)
    if kind == "FrozenBN":
        return FrozenBatchNorm2d(num_features, eps=eps)
    if kind == "BRN":
        return BatchRenorm2d(num_features, eps=eps, momentum=momentum)
    if kind == "SyncBRN":
        return SyncBatchRenorm(num_features, eps=eps, momentum=momentum)
    if kind == "GN":
        groups = min(gn_groups, num_features)
        while num_features % groups:  # largest group count <= gn_groups that divides the channels
            groups -= 1
        return M.GroupNorm(groups, num_features, eps=eps)
    raise ValueError(f"unknown norm {kind!r}: model.norm must be one of {', '.join(NORM_KINDS)}")
