"""SyncBatchNorm's cross-rank statistics merge, in numpy, for checks without MegEngine.

What each rank sends (``pack_row``) and how the gathered rows are merged (``merge_rows``) mirror
basebn/layers/bn_function.py's ``_pack`` / ``_unpack`` (one float32 row ``[count_hi, count_lo, mean(C), m2(C)]``,
count = hi * 2**20 + lo) and use basebn/layers/moments.py itself (Chan's merge in float64, rank order),
loaded from its file: it needs only numpy. tests/tools/test_cuda_harness.py checks the mirror against
bn_function. ``all_reduce_sum`` is the backward's float32 sum of the ranks' ``[sum dy, sum dy*xhat]``.
"""
import importlib.util
import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
MOMENTS_PY = os.path.join(os.path.dirname(os.path.dirname(HERE)), "basebn", "layers", "moments.py")
_SPLIT = float(2 ** 20)


def _load_moments():
    spec = importlib.util.spec_from_file_location("basebn_moments_standalone", MOMENTS_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


moments = _load_moments()


def pack_row(count, mean, m2):
    """The float32 row a rank all-gathers: ``[count_hi, count_lo, mean(C), m2(C)]``."""
    hi = float(count // int(_SPLIT))
    lo = float(count - int(hi) * int(_SPLIT))
    return np.concatenate([np.array([hi, lo], np.float32), np.asarray(mean, np.float32), np.asarray(m2, np.float32)])


def merge_rows(rows, channels):
    """The whole batch's :class:`moments.Moments` (float64) from the gathered rows, merged in rank order."""
    g = np.asarray(rows, dtype=np.float64)
    parts = [moments.Moments(r[0] * _SPLIT + r[1], r[2:2 + channels], r[2 + channels:2 + 2 * channels]) for r in g]
    return moments.merge_all(parts, channels)


def all_reduce_sum(parts):
    """Element-wise float32 sum of the ranks' arrays, in rank order."""
    total = np.zeros_like(np.asarray(parts[0], np.float32))
    for p in parts:
        total = total + np.asarray(p, np.float32)
    return total


def shard_bounds(sizes):
    """[(lo, hi)] rows of each rank for per-rank batch sizes ``sizes``."""
    edges = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])]
