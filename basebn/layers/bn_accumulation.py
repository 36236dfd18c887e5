"""Accumulation-aware BN statistics: micro-batches normalised as usual, running statistics updated once.

Inside :func:`accumulate_bn_stats` every train-mode BN layer of basebn (BatchNorm2d, SyncBatchNorm, Batch
Renormalization, ghost BN) hands its batch statistics to a :class:`BNStatsAccumulator` instead of its
buffers (:func:`.bn_guard.record_batch`); on exit each layer moves its running statistics ONCE, with the
statistics of all its micro-batches pooled: count-weighted mean and pooled unbiased variance (Chan's merge),
what one forward of the concatenated batch would have recorded. Ghost-BN layers report group averages; those
pool as the average over all groups. MegEngine's own BN layers are not basebn's and keep updating per batch.
"""
import contextlib
from typing import Iterator

import megengine.module as M

import megengine.functional as F

from .bn_guard import apply_running_update
from .norm import has_running_stats, is_bn

__all__ = ["BNStatsAccumulator", "accumulate_bn_stats"]


def _pool_moments(parts):
    """(mean, unbiased var) of the union of batches given as (count, mean, unbiased var) (float32, device)."""
    total = float(sum(p[0] for p in parts))
    mean = sum(p[1] * (p[0] / total) for p in parts)
    m2 = sum(p[2] * (p[0] - 1.0) + (p[1] - mean) ** 2 * p[0] for p in parts)
    return mean, m2 / max(total - 1.0, 1.0)


def _pool_groups(parts):
    """(mean, var) averaged over every normalisation group of batches given as (groups, mean, var)."""
    total = float(sum(p[0] for p in parts))
    return sum(p[1] * (p[0] / total) for p in parts), sum(p[2] * (p[0] / total) for p in parts)


class BNStatsAccumulator:
    """Collects the batch statistics of `model`'s BN layers between :meth:`start` and :meth:`finish`.

    :meth:`finish` applies one pooled update per layer that saw a batch (the non-finite guard included) and
    detaches; :meth:`discard` detaches without touching any buffer. The trainer holds one across the
    micro-batches of an optimizer step; :func:`accumulate_bn_stats` is the same as a context manager.

    Args:
        model: the model; its BN layers with running statistics are the ones collected.
    """

    def __init__(self, model: M.Module):
        self.layers = [m for m in model.modules() if is_bn(m) and has_running_stats(m)]
        self._parts = {}
        self.active = False

    def start(self):
        """Route the layers' batch statistics here until :meth:`finish` or :meth:`discard`."""
        self._parts = {}
        for m in self.layers:
            m.__dict__["_bn_stats_sink"] = self
        self.active = True

    def add(self, bn, mean, var, count, groups=None):
        """One batch of `bn` (called by :func:`.bn_guard.record_batch`)."""
        weight = float(count) if groups is None else float(groups)
        self._parts.setdefault(id(bn), (bn, groups is not None, []))[2].append(
            (weight, mean.detach(), var.detach()))

    def _detach(self):
        for m in self.layers:
            m.__dict__.pop("_bn_stats_sink", None)
        self.active = False

    def finish(self):
        """One running-statistics update per layer with the pooled statistics; returns how many layers moved."""
        self._detach()
        parts, self._parts = self._parts, {}
        for bn, grouped, batches in parts.values():
            mean, var = (_pool_groups if grouped else _pool_moments)(batches)
            apply_running_update(bn, F.copy(mean), F.copy(var))
        return len(parts)

    def discard(self):
        """Stop collecting and forget what was collected (no buffer changes)."""
        self._detach()
        self._parts = {}


@contextlib.contextmanager
def accumulate_bn_stats(model: M.Module) -> Iterator[BNStatsAccumulator]:
    """Within the block, `model`'s train-mode BN layers normalise each micro-batch as usual but leave their
    running statistics alone; on normal exit each updates them once with the pooled statistics of every
    micro-batch it saw (= one forward of the concatenated batch). On an exception nothing is updated.

    Args:
        model: the model.

    Returns:
        A context manager yielding the :class:`BNStatsAccumulator`.
    """
    acc = BNStatsAccumulator(model)
    acc.start()
    try:
        yield acc
    except BaseException:
        acc.discard()
        raise
    acc.finish()
