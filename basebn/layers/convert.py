"""Model-wide BN conversions: to / from SyncBatchNorm and to / from FrozenBatchNorm2d.

Each returns the converted model: ``model`` itself with its BN layers replaced in place, or the
new layer when ``model`` is itself one. Values (and, for SyncBN, the very Parameter and buffer
objects) are kept.
"""
from typing import Any

import megengine.module as M

from .batch_norm import BatchNorm2d
from .bn_act import carry_act
from .conv_bn import disable_efficient_conv_bn_eval, enable_efficient_conv_bn_eval
from .frozen_bn import FrozenBatchNorm2d
from .module_tree import replace_modules
from .norm import is_bn, is_bn2d, is_frozen_bn
from .sync_bn import SyncBatchNorm

__all__ = ["convert_sync_batchnorm", "revert_sync_batchnorm", "convert_frozen_batchnorm", "convert_to_batchnorm"]

def _transfer(src, dst):
    """Move ``src``'s tensors (the same Parameter/buffer objects, so an optimizer built on them
    keeps working), flags, names and hooks onto ``dst``."""
    if src.affine:
        dst.weight, dst.bias = src.weight, src.bias
    if src._track_running_stats_saved:
        dst.running_mean, dst.running_var = src.running_mean, src.running_var
    dst.track_running_stats = src.track_running_stats
    if hasattr(src, "num_batches_tracked"):  # the cumulative-average counter (a plain attribute)
        dst.num_batches_tracked = src.num_batches_tracked
    dst.training = src.training
    dst._name, dst._short_name = src._name, src._short_name
    dst._forward_pre_hooks.update(src._forward_pre_hooks)
    dst._forward_hooks.update(src._forward_hooks)
    return carry_act(src, dst)  # a fused BN-activation layer keeps its activation


def _to_sync(bn, group):
    new = SyncBatchNorm(bn.num_features, eps=bn.eps, momentum=bn.momentum, affine=bn.affine,
                        track_running_stats=bn._track_running_stats_saved, group=group,
                        freeze=getattr(bn, "freeze", False), name=bn.name)
    new._revert_cls = _revert_class(bn)
    return _transfer(bn, new)


def _revert_class(bn):
    """What a SyncBatchNorm converted from ``bn`` reverts to: MegEngine's BatchNorm1d or BatchNorm2d
    when ``bn`` is one, else basebn's BatchNorm2d (for megengine's SyncBatchNorm too)."""
    if isinstance(bn, M.BatchNorm1d):
        return M.BatchNorm1d
    return M.BatchNorm2d if type(bn) is M.BatchNorm2d else BatchNorm2d


def _to_plain(bn):
    cls = getattr(bn, "_revert_cls", BatchNorm2d)
    keeps_none = issubclass(cls, BatchNorm2d)  # MegEngine's own BN has no cumulative mode
    momentum = 0.9 if bn.momentum is None and not keeps_none else bn.momentum
    new = cls(bn.num_features, eps=bn.eps, momentum=momentum, affine=bn.affine,
              track_running_stats=bn._track_running_stats_saved, freeze=bn.freeze, name=bn.name)
    return _transfer(bn, new)


def convert_sync_batchnorm(module: M.Module, group: Any = None) -> M.Module:
    """Replace every BN layer of ``module`` but FrozenBatchNorm2d (MegEngine's BatchNorm1d / BatchNorm2d /
    SyncBatchNorm) by a :class:`SyncBatchNorm` holding the same weight/bias/running tensors, name,
    eps, momentum, affine, freeze and train/eval flag.

    Convert before building the optimizer (the Parameters are shared, so one built earlier keeps
    working too).

    Args:
        module: the model (converted in place) or a single BN layer.
        group: a :func:`basebn.distributed.new_group` group to synchronise over; None: all ranks.

    Returns:
        `module`, or its replacement when `module` is itself a BN layer.
    """
    def convert(m):
        return _to_sync(m, group) if is_bn(m) and not (is_frozen_bn(m) or isinstance(m, SyncBatchNorm)) else None

    return replace_modules(module, convert)


def revert_sync_batchnorm(module: M.Module) -> M.Module:
    """Replace every :class:`SyncBatchNorm` by a local BN with the same tensors and settings: the
    class it was converted from (MegEngine's BatchNorm1d / BatchNorm2d, basebn's BatchNorm2d), basebn's
    :class:`BatchNorm2d` (what ``build_norm("BN")`` builds) for one built directly or converted from
    megengine's SyncBatchNorm. ``momentum=None`` stays None on basebn's BatchNorm2d and becomes 0.9 on
    MegEngine's classes (they have no cumulative mode).

    Args:
        module: the model (converted in place) or a single SyncBatchNorm.

    Returns:
        `module`, or its replacement when `module` is itself a SyncBatchNorm.
    """
    return replace_modules(module, lambda m: _to_plain(m) if isinstance(m, SyncBatchNorm) else None)


def _keeping_efficient_pairs(module, convert):
    """``replace_modules(module, convert)`` with efficient conv-BN pairs undone, then switched back on."""
    new = convert(module)
    if new is not None:  # module itself is converted: it holds no pairs
        return new
    pairs = disable_efficient_conv_bn_eval(module)
    out = replace_modules(module, convert)
    if pairs:
        enable_efficient_conv_bn_eval(out, pairs=pairs)
    return out


def convert_frozen_batchnorm(module: M.Module) -> M.Module:
    """Convert every BN layer that can follow a conv (BatchNorm2d, SyncBatchNorm) to :class:`FrozenBatchNorm2d`.

    Values are kept; pairs switched by ``enable_efficient_conv_bn_eval`` stay switched (re-linked to
    the new modules).

    Args:
        module: the model (converted in place) or a single BN layer.

    Returns:
        `module`, or its replacement when `module` is itself a BN layer.
    """
    def convert(m):
        return carry_act(m, FrozenBatchNorm2d.from_batchnorm(m)) if is_bn2d(m) and not is_frozen_bn(m) else None

    return _keeping_efficient_pairs(module, convert)


def convert_to_batchnorm(module: M.Module, norm_cls: type = BatchNorm2d, **kwargs: Any) -> M.Module:
    """Inverse of :func:`convert_frozen_batchnorm`: every FrozenBatchNorm2d becomes a trainable ``norm_cls``.

    Args:
        module: the model (converted in place) or a single FrozenBatchNorm2d.
        norm_cls: the BN class to build (default basebn's :class:`BatchNorm2d`, as ``build_norm("BN")``).
        **kwargs: to `norm_cls`'s constructor.

    Returns:
        `module`, or its replacement when `module` is itself a FrozenBatchNorm2d.
    """
    def convert(m):
        return m.to_batchnorm(norm_cls, **kwargs) if is_frozen_bn(m) else None

    return _keeping_efficient_pairs(module, convert)
