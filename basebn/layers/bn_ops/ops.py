"""The public BN ops: check arguments, then run the kernel or the fallback path."""
import numpy as np

import megengine as mge

from . import fallback, kernel
from .backend import backend

__all__ = ["bn_stats", "bn_normalize", "bn_backward_reduce", "bn_backward_elemt", "channel_count"]


def _check(x, name="x"):
    if x.ndim < 2 or x.ndim > 5:
        raise ValueError(f"{name} must have 2 to 5 dims (N, C, *), got shape {tuple(x.shape)}")
    if np.dtype(x.dtype) not in (np.float32, np.float16):
        raise TypeError(f"{name} must be float32 or float16, got {x.dtype}")


def _per_channel(v, c):
    """``v`` as a float32 (C,) tensor (None stays None)."""
    if v is None:
        return None
    if not isinstance(v, mge.Tensor):
        v = mge.tensor(np.asarray(v, dtype=np.float32))
    if v.dtype != np.float32:
        v = v.astype("float32")
    if tuple(v.shape) != (c,):
        v = v.reshape(c)
    return v


def _same_dtype(dy, x):
    """The kernels take one input dtype: float32 for both when dy and x differ."""
    if dy.dtype == x.dtype:
        return dy, x
    return dy.astype("float32"), x.astype("float32")


def channel_count(x):
    """Values per channel of ``x`` (N, C, *): N times the spatial size."""
    c = x.shape[1]
    return int(np.prod(x.shape)) // c if c else 0


def bn_stats(x):
    """Per-channel ``(mean, m2)`` over N and all spatial dims, float32 (C,) each.

    ``m2 = sum((x - mean)**2)``; the count is :func:`channel_count`. Numerically stable
    (two-pass in the fallback, Welford/Chan-merged blocks in the kernels). N=0 gives zeros.
    """
    _check(x)
    if backend() == "kernel" and kernel.ready(x):
        return kernel.stats(x)
    return fallback.stats(x)


def bn_normalize(x, mean, invstd, weight=None, bias=None):
    """``y = (x - mean) * invstd * weight + bias`` with the dtype of ``x``."""
    _check(x)
    c = x.shape[1]
    mean, invstd, weight, bias = (_per_channel(v, c) for v in (mean, invstd, weight, bias))
    if backend() == "kernel" and kernel.ready(x, mean, invstd, weight, bias):
        return kernel.normalize(x, mean, invstd, weight, bias)
    return fallback.normalize(x, mean, invstd, weight, bias)


def bn_backward_reduce(dy, x, mean, invstd):
    """Per-channel ``(sum(dy), sum(dy * xhat))``, ``xhat = (x - mean) * invstd``, float32 (C,)."""
    _check(x)
    _check(dy, "dy")
    c = x.shape[1]
    mean, invstd = _per_channel(mean, c), _per_channel(invstd, c)
    if backend() == "kernel":
        dy, x = _same_dtype(dy, x)
        if kernel.ready(x, dy, mean, invstd):
            return kernel.backward_reduce(dy, x, mean, invstd)
    return fallback.backward_reduce(dy, x, mean, invstd)


def bn_backward_elemt(dy, x, mean, invstd, weight, sum_dy, sum_dy_xhat, count):
    """``dx = w * invstd * (dy - sum_dy/count - xhat * sum_dy_xhat/count)`` with dy's dtype.

    ``count`` is the global per-channel element count (may exceed the local one under SyncBN);
    ``weight=None`` means 1.
    """
    _check(x)
    _check(dy, "dy")
    c = x.shape[1]
    mean, invstd, weight, sum_dy, sum_dy_xhat = (
        _per_channel(v, c) for v in (mean, invstd, weight, sum_dy, sum_dy_xhat))
    count = float(count)
    if backend() == "kernel":
        out_dtype = dy.dtype
        dy, x = _same_dtype(dy, x)
        if kernel.ready(x, dy, mean, invstd, weight, sum_dy, sum_dy_xhat):
            dx = kernel.backward_elemt(dy, x, mean, invstd, weight, sum_dy, sum_dy_xhat, count)
        else:
            dx = fallback.backward_elemt(dy, x, mean, invstd, weight, sum_dy, sum_dy_xhat, count)
        return dx if dx.dtype == out_dtype else dx.astype(out_dtype)
    return fallback.backward_elemt(dy, x, mean, invstd, weight, sum_dy, sum_dy_xhat, count)
