"""Per-channel moments (count, mean, M2) in float64 on the host, and Chan's merge of them.

The one combine rule for BN statistics: SyncBatchNorm merges the ranks' batch moments with it,
precise BN merges batches and then ranks. Merging in a fixed order gives bit-identical results
on every rank.
"""
from typing import NamedTuple

import numpy as np

__all__ = ["Moments", "empty_moments", "merge_moments", "merge_all"]


class Moments(NamedTuple):
    """``count`` values per channel, their per-channel ``mean`` and ``m2 = sum((x - mean)**2)`` (float64)."""

    count: float
    mean: np.ndarray
    m2: np.ndarray

    def unbiased_var(self):
        """``m2 / (count - 1)`` (``count - 1`` clamped to at least 1)."""
        return self.m2 / max(self.count - 1.0, 1.0)


def empty_moments(channels):
    """The moments of no values (the identity of :func:`merge_moments`)."""
    return Moments(0.0, np.zeros(channels), np.zeros(channels))


def merge_moments(a, b):
    """Moments of the union of two disjoint sets (Chan et al.); an empty side returns the other as is."""
    if b.count <= 0:
        return a
    if a.count <= 0:
        return Moments(float(b.count), np.asarray(b.mean, np.float64), np.asarray(b.m2, np.float64))
    total = a.count + b.count
    delta = b.mean - a.mean
    mean = a.mean + delta * (b.count / total)
    m2 = a.m2 + b.m2 + delta ** 2 * (a.count * b.count / total)
    return Moments(total, mean, m2)


def merge_all(parts, channels):
    """Merge ``parts`` (an iterable of :class:`Moments` or (count, mean, m2) triples) left to right."""
    out = empty_moments(channels)
    for part in parts:
        out = merge_moments(out, Moments(*part))
    return out
