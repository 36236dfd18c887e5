"""The one place BN running statistics change in training: a guarded update, a per-layer non-finite count,
snapshots for rolling a step back, and the hand-off to an active accumulation (:mod:`.bn_accumulation`).

:func:`record_batch` is what basebn's BatchNorm2d / SyncBatchNorm / BatchRenorm2d call with a training
batch's statistics. A batch whose mean or variance holds a NaN or inf leaves the layer's buffers unchanged
(decided on the device by :func:`basebn.ops.bn_ops.bn_running_update`: no host copy with a momentum) and adds one to the
layer's non-finite count, read and cleared by :func:`take_nonfinite_counts`. The counter lives in a plain holder
object, never a Tensor attribute, so state dicts gain no key. A local layer's training op can make the same update
itself (:func:`in_op_update_args` says when; :func:`store_in_op_update` stores what it made): one op per layer
and step fewer, the same bits.
"""
from typing import Dict, List, Optional, Tuple

import numpy as np

import megengine as mge
import megengine.module as M

from ..ops import bn_ops

__all__ = ["record_batch", "apply_running_update", "in_op_update_args", "store_in_op_update", "take_nonfinite_counts",
           "running_stats_layers", "snapshot_running_stats", "restore_running_stats"]


class _Counter:
    """A device int32 (1,) count of non-finite batches (a holder, so Module state dicts never see it)."""

    def __init__(self):
        self.value = None


def _counter(bn):
    holder = bn.__dict__.get("_nonfinite_counter")
    if holder is None:
        holder = _Counter()
        bn.__dict__["_nonfinite_counter"] = holder
    return holder


def _bad_count(bn):
    """The layer's device count of non-finite batches (created at zero)."""
    holder = _counter(bn)
    if holder.value is None:
        holder.value = mge.tensor(np.zeros(1, np.int32), device=bn.running_mean.device)
    return holder.value


def _store(bn, new_mean, new_var, new_bad, counted):
    """The buffers' new values, the new non-finite count, and one more tracked batch when it ``counted``."""
    bn.running_mean[...] = new_mean.detach()
    bn.running_var[...] = new_var.detach()
    _counter(bn).value = new_bad
    if counted:
        bn.num_batches_tracked = getattr(bn, "num_batches_tracked", 0) + 1


def in_op_update_args(bn: M.Module) -> Optional[Tuple[mge.Tensor, mge.Tensor, mge.Tensor, float]]:
    """The inputs of :func:`apply_running_update`'s update done inside the training op itself
    (:func:`basebn.ops.bn_ops.bn_act_train_forward_update`, then :func:`store_in_op_update`).

    Args:
        bn: a BN layer in training (running_mean, running_var, momentum).

    Returns:
        ``(running_mean, running_var, bad, keep)``: the buffers, the layer's device count of non-finite batches
        and the momentum; None where the batch must go through :func:`record_batch`: an active accumulation, or
        ``momentum=None`` (its cumulative average reads on the host whether the batch counted).
    """
    if bn.__dict__.get("_bn_stats_sink") is not None or bn.momentum is None:
        return None
    return bn.running_mean, bn.running_var, _bad_count(bn), float(bn.momentum)


def store_in_op_update(bn: M.Module, new_mean: mge.Tensor, new_var: mge.Tensor, new_bad: mge.Tensor) -> None:
    """What :func:`apply_running_update` stores, from the outputs of an update done in the training op.

    Args:
        bn: the layer :func:`in_op_update_args` gave the inputs of.
        new_mean: (C,) running mean the op computed.
        new_var: (C,) running variance the op computed.
        new_bad: (1,) int32 non-finite batch count the op computed.
    """
    _store(bn, new_mean, new_var, new_bad, counted=True)


def apply_running_update(bn: M.Module, mean: mge.Tensor, var: mge.Tensor) -> None:
    """``running = keep * running + (1 - keep) * batch`` unless `mean`/`var` hold a non-finite value.

    MegEngine's momentum convention (``keep = momentum``; ``momentum=None``: cumulative average over the
    finite batches). A non-finite batch leaves both buffers bit-identical and is counted for the layer. One
    :func:`basebn.ops.bn_ops.bn_running_update` (one kernel call on CPU); the cumulative average also reads on the host
    whether the batch counted, since only finite batches advance its count.

    Args:
        bn: a BN layer (running_mean, running_var, momentum; num_batches_tracked for ``momentum=None``).
        mean: (C,) batch mean.
        var: (C,) unbiased batch variance.
    """
    tracked = getattr(bn, "num_batches_tracked", 0)
    cumulative = bn.momentum is None
    keep = 1.0 - 1.0 / (tracked + 1) if cumulative else float(bn.momentum)
    bad = _bad_count(bn)
    new_mean, new_var, new_bad = bn_ops.bn_running_update(bn.running_mean, bn.running_var, mean, var, keep, bad)
    # (cumulative: a non-finite batch is not one of the averaged batches)
    _store(bn, new_mean, new_var, new_bad, counted=not (cumulative and bool((new_bad != bad).item())))


def record_batch(bn: M.Module, mean: mge.Tensor, var: mge.Tensor, count: int, groups: Optional[int] = None) -> None:
    """A training batch's statistics for `bn`.

    Inside :func:`basebn.layers.accumulate_bn_stats` the batch goes to the accumulation; otherwise the
    running statistics move now (:func:`apply_running_update`).

    Args:
        bn: the BN layer the batch went through.
        mean: (C,) batch mean.
        var: (C,) unbiased batch variance.
        count: values per channel the statistics are over.
        groups: when given, `mean` and `var` are the average over that many normalisation groups (ghost BN).
    """
    sink = bn.__dict__.get("_bn_stats_sink")
    if sink is not None:
        sink.add(bn, mean, var, count, groups)
        return
    apply_running_update(bn, mean, var)


def take_nonfinite_counts(model: M.Module) -> Dict[str, int]:
    """Reads and clears the non-finite batch counts of `model`'s BN layers. One host copy per layer.

    Args:
        model: the model whose BN layers count.

    Returns:
        ``{layer name: batches}`` of the layers whose batch statistics were non-finite since the last call
        (layers without any are left out).
    """
    out = {}
    for name, m in model.named_modules():
        holder = m.__dict__.get("_nonfinite_counter")
        if holder is None or holder.value is None:
            continue
        n = int(holder.value.item())
        holder.value = None
        if n:
            out[name or type(m).__name__] = n
    return out


def running_stats_layers(model: M.Module) -> List[M.Module]:
    """The layers of `model` whose running mean/var a snapshot covers (BN layers, MegEngine's own included).

    Args:
        model: the model to search.

    Returns:
        Its modules with Tensor ``running_mean`` and ``running_var`` and a ``momentum``, in module order.
    """
    return [m for m in model.modules() if isinstance(getattr(m, "running_mean", None), mge.Tensor)
            and isinstance(getattr(m, "running_var", None), mge.Tensor) and hasattr(m, "momentum")]


def snapshot_running_stats(model: M.Module, layers: Optional[List[M.Module]] = None
                           ) -> List[Tuple[M.Module, mge.Tensor, mge.Tensor, Optional[int]]]:
    """Handles on every running mean/var (and cumulative counter) of `model`'s BN layers, for
    :func:`restore_running_stats`.

    No copy and no op: every update replaces a buffer's value (``buffer[...] = new`` rebinds it; no op writes
    into a running buffer, MegEngine's BN op included), so a detached handle keeps the value it was taken of.

    Args:
        model: the model whose running statistics to keep.
        layers: a :func:`running_stats_layers` list kept by the caller (None: found in `model` now).

    Returns:
        ``[(layer, running_mean, running_var, num_batches_tracked or None)]``, one per layer.
    """
    layers = running_stats_layers(model) if layers is None else layers
    return [(m, m.running_mean.detach(), m.running_var.detach(), getattr(m, "num_batches_tracked", None))
            for m in layers]


def restore_running_stats(snapshot: List[Tuple[M.Module, mge.Tensor, mge.Tensor, Optional[int]]]) -> None:
    """Put back the buffers (bit-identical) and counters a :func:`snapshot_running_stats` took.

    Args:
        snapshot: what :func:`snapshot_running_stats` returned.
    """
    for m, rm, rv, tracked in snapshot:
        m.running_mean[...] = rm
        m.running_var[...] = rv
        if tracked is not None:
            m.num_batches_tracked = tracked
