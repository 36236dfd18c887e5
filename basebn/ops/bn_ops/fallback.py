"""The BN ops in pure ``megengine.functional``: float32 accumulation, two-pass statistics.

Same signatures and numerics as the kernels; inputs are already checked by the dispatcher.
"""
import numpy as np

import megengine.functional as F

__all__ = ["stats", "normalize", "backward_reduce", "backward_elemt", "act_normalize", "act_backward_reduce",
           "act_backward_elemt", "running_update"]


def _bshape(x):
    return (1, x.shape[1]) + (1,) * (x.ndim - 2)


def _spatial(x):
    s = 1
    for v in x.shape[2:]:
        s *= int(v)
    return s


def _as_float32(t):
    return t if t.dtype == np.float32 else t.astype("float32")


def stats(x):
    """Per-channel ``(mean, m2)``, two-pass."""
    n, c, s = x.shape[0], x.shape[1], _spatial(x)
    cnt = n * s
    if cnt == 0:  # (reshape with -1 on an empty tensor crashes MegEngine 1.13)
        return F.zeros((c,), dtype="float32"), F.zeros((c,), dtype="float32")
    x3 = _as_float32(x.reshape(n, c, s))
    mean = F.sum(x3, axis=(0, 2)) / cnt
    d = x3 - mean.reshape(1, c, 1)
    m2 = F.sum(d * d, axis=(0, 2))
    return mean, m2


def normalize(x, mean, invstd, weight, bias):
    """``(x - mean) * invstd * weight + bias`` in x's dtype."""
    # (x - mean) * scale + bias, not x * scale + shift: no cancellation when |mean| >> std
    scale = invstd if weight is None else invstd * weight
    bs = _bshape(x)
    y = (_as_float32(x) - mean.reshape(bs)) * scale.reshape(bs)
    if bias is not None:
        y = y + bias.reshape(bs)
    return y if y.dtype == x.dtype else y.astype(x.dtype)


def backward_reduce(dy, x, mean, invstd):
    """Per-channel ``(sum(dy), sum(dy * xhat))``."""
    n, c, s = x.shape[0], x.shape[1], _spatial(x)
    if n * s == 0:
        return F.zeros((c,), dtype="float32"), F.zeros((c,), dtype="float32")
    x3 = _as_float32(x.reshape(n, c, s))
    g3 = _as_float32(dy.reshape(n, c, s))
    sum_dy = F.sum(g3, axis=(0, 2))
    sum_dy_xc = F.sum(g3 * (x3 - mean.reshape(1, c, 1)), axis=(0, 2))
    return sum_dy, sum_dy_xc * invstd


def backward_elemt(dy, x, mean, invstd, weight, sum_dy, sum_dy_xhat, count):
    """``dx = w * invstd * (dy - sum_dy / count - xhat * sum_dy_xhat / count)`` in dy's dtype."""
    # dx = a * (dy - mdy - (x - mean) * k), a = w * invstd, mdy = sum_dy / count,
    # k = invstd * sum_dy_xhat / count
    inv_cnt = 1.0 / float(count) if count else 0.0
    a = invstd if weight is None else weight * invstd
    mdy = sum_dy * inv_cnt
    k = invstd * sum_dy_xhat * inv_cnt
    bs = _bshape(x)
    dx = (_as_float32(dy) - mdy.reshape(bs) - (_as_float32(x) - mean.reshape(bs)) * k.reshape(bs)) * a.reshape(bs)
    return dx if dx.dtype == dy.dtype else dx.astype(dy.dtype)


# ---- fused BN -> activation, as the kernels compute it: float32 throughout, one rounding to x's dtype
_ACTIVATIONS = {"identity": lambda v: v, "relu": F.relu, "relu6": F.relu6, "silu": F.silu, "hswish": F.hswish}


def _act_grad(dy, y, pre, act):
    """``dz = act'(pre) * dy`` in float32: ReLU / ReLU6 read the derivative from the output ``y``, SiLU / HSwish
    from ``pre`` (a zero derivative gives 0, even for a non-finite dy; HSwish's kinks as MegEngine's gradient)."""
    dy = _as_float32(dy)
    if act == "identity":
        return dy
    if act == "silu":
        s = F.sigmoid(pre)
        return dy * (s * (1 + pre * (1 - s)))
    zeros = F.zeros_like(dy)
    if act == "hswish":
        return F.where(pre < -3, zeros, F.where(pre > 3, dy, dy * (2 * pre + 3) / 6))
    y = _as_float32(y)
    keep = y > 0 if act == "relu" else (y > 0) & (y < 6)
    return F.where(keep, dy, zeros)


def _pre(x, mean, invstd, weight, bias, act):
    """The pre-activation (float32) where the derivative needs it (SiLU, HSwish), else None."""
    return normalize(_as_float32(x), mean, invstd, weight, bias) if act in ("silu", "hswish") else None


def act_normalize(x, shortcut, mean, invstd, weight, bias, act):
    """``act((x - mean) * invstd * weight + bias [+ shortcut])`` in x's dtype."""
    pre = normalize(_as_float32(x), mean, invstd, weight, bias)
    if shortcut is not None:
        pre = pre + _as_float32(shortcut)
    y = _ACTIVATIONS[act](pre)
    return y if y.dtype == x.dtype else y.astype(x.dtype)


def act_backward_reduce(dy, y, x, mean, invstd, weight, bias, act):
    """Per-channel ``(sum(dz), sum(dz * xhat))``, ``dz = act'(pre) * dy``."""
    dz = _act_grad(dy, y, _pre(x, mean, invstd, weight, bias, act), act)
    return backward_reduce(dz, x, mean, invstd)


def act_backward_elemt(dy, y, x, mean, invstd, weight, bias, sum_dz, sum_dz_xhat, count, act, shortcut_grad):
    """``(dx,)`` or ``(dx, dshortcut = dz)`` in dy's dtype, ``dz = act'(pre) * dy``."""
    dz = _act_grad(dy, y, _pre(x, mean, invstd, weight, bias, act), act)
    dx = backward_elemt(dz, x, mean, invstd, weight, sum_dz, sum_dz_xhat, count)
    outs = (dx, dz) if shortcut_grad else (dx,)
    return tuple(t if t.dtype == dy.dtype else t.astype(dy.dtype) for t in outs)


def running_update(running_mean, running_var, mean, var, keep, bad):
    """``(running_mean', running_var', bad')``: ``running * keep + batch * (1 - keep)`` when every value of mean and
    var is finite (``x * 0`` is NaN exactly for NaN/inf), else the running values and ``bad + 1``."""
    ok = (F.sum(mean * 0.0) + F.sum(var * 0.0)) == 0
    cond = F.broadcast_to(ok.reshape(1), running_mean.shape)
    new_mean = F.where(cond, running_mean * keep + mean * (1.0 - keep), running_mean)
    new_var = F.where(cond, running_var * keep + var * (1.0 - keep), running_var)
    return new_mean, new_var, bad + (1 - ok.astype("int32")).reshape(1)
