"""Comparison helpers shared by the op tests: relative error against a reference, (h, w) pairs."""
import numpy as np

__all__ = ["rel_err", "pair"]


def rel_err(a, b):
    """max |a - b| / max |b| in float64 (shapes must match)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def pair(v):
    """``v`` as an (h, w) tuple."""
    return tuple(v) if isinstance(v, tuple) else (v, v)
