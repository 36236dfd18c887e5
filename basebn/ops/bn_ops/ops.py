"""The public BN ops: check arguments, then run the kernel or the fallback path."""
import math
from typing import Optional, Tuple, Union

import numpy as np

import megengine as mge

from . import fallback, kernel
from .backend import backend

__all__ = ["bn_stats", "bn_normalize", "bn_backward_reduce", "bn_backward_elemt", "channel_count", "ACTIVATIONS",
           "OUTPUT_GRAD_ACTIVATIONS", "PRE_GRAD_ACTIVATIONS", "bn_act_normalize", "bn_act_backward_reduce",
           "bn_act_backward_elemt", "bn_act_train_forward", "bn_act_train_forward_update", "bn_act_train_backward",
           "bn_running_update"]


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


def _channel_values(v, c):
    """A per-channel input of the one-call training ops: ``v`` as it is when it is a float32 tensor of ``c`` values
    in any shape (the CPU kernels read values, not shapes: a BN parameter's (1, C, 1, 1) needs no reshape op),
    else :func:`_per_channel`'s (C,) tensor."""
    if isinstance(v, mge.Tensor) and v.dtype == np.float32 and math.prod(v.shape) == c:
        return v
    return _per_channel(v, c)


def _same_dtype(dy, x):
    """The kernels take one input dtype: float32 for both when dy and x differ."""
    if dy.dtype == x.dtype:
        return dy, x
    return dy.astype("float32"), x.astype("float32")


def channel_count(x: mge.Tensor) -> int:
    """Values per channel of ``x`` (N, C, *): N times the spatial size.

    Args:
        x: (N, C, *).
    """
    c = x.shape[1]
    return math.prod(x.shape) // c if c else 0


def bn_stats(x: mge.Tensor) -> Tuple[mge.Tensor, mge.Tensor]:
    """Per-channel ``(mean, m2)`` over N and all spatial dims, float32 (C,) each.

    ``m2 = sum((x - mean)**2)``; the count is :func:`channel_count`. Numerically stable
    (two-pass in the fallback, Welford/Chan-merged blocks in the kernels). N=0 gives zeros.

    Args:
        x: (N, C, *) with 2 to 5 dims, float32 or float16.

    Returns:
        ``(mean, m2)``.

    Raises:
        ValueError: `x` of another rank or dtype.
    """
    _check(x)
    if backend() == "kernel" and kernel.ready(x):
        return kernel.stats(x)
    return fallback.stats(x)


def bn_normalize(x: mge.Tensor, mean: Union[mge.Tensor, np.ndarray], invstd: Union[mge.Tensor, np.ndarray],
                 weight: Optional[Union[mge.Tensor, np.ndarray]] = None,
                 bias: Optional[Union[mge.Tensor, np.ndarray]] = None) -> mge.Tensor:
    """``y = (x - mean) * invstd * weight + bias`` with the dtype of ``x``.

    Args:
        x: (N, C, *) with 2 to 5 dims, float32 or float16.
        mean: C values.
        invstd: C values, ``1 / sqrt(var + eps)``.
        weight: C values; None: 1.
        bias: C values; None: 0.

    Returns:
        y, shaped as x.
    """
    _check(x)
    c = x.shape[1]
    mean, invstd, weight, bias = (_per_channel(v, c) for v in (mean, invstd, weight, bias))
    if backend() == "kernel" and kernel.ready(x, mean, invstd, weight, bias):
        return kernel.normalize(x, mean, invstd, weight, bias)
    return fallback.normalize(x, mean, invstd, weight, bias)


def bn_backward_reduce(dy: mge.Tensor, x: mge.Tensor, mean: Union[mge.Tensor, np.ndarray],
                       invstd: Union[mge.Tensor, np.ndarray]) -> Tuple[mge.Tensor, mge.Tensor]:
    """Per-channel ``(sum(dy), sum(dy * xhat))``, ``xhat = (x - mean) * invstd``, float32 (C,).

    Args:
        dy: the output gradient, shaped as x.
        x: the forward's input, (N, C, *).
        mean: C values, the forward's.
        invstd: C values, the forward's.

    Returns:
        ``(sum_dy, sum_dy_xhat)``.
    """
    _check(x)
    _check(dy, "dy")
    c = x.shape[1]
    mean, invstd = _per_channel(mean, c), _per_channel(invstd, c)
    if backend() == "kernel":
        dy, x = _same_dtype(dy, x)
        if kernel.ready(x, dy, mean, invstd):
            return kernel.backward_reduce(dy, x, mean, invstd)
    return fallback.backward_reduce(dy, x, mean, invstd)


def bn_backward_elemt(dy: mge.Tensor, x: mge.Tensor, mean: Union[mge.Tensor, np.ndarray],
                      invstd: Union[mge.Tensor, np.ndarray], weight: Optional[Union[mge.Tensor, np.ndarray]],
                      sum_dy: Union[mge.Tensor, np.ndarray], sum_dy_xhat: Union[mge.Tensor, np.ndarray],
                      count: float) -> mge.Tensor:
    """``dx = w * invstd * (dy - sum_dy/count - xhat * sum_dy_xhat/count)`` with dy's dtype.

    Args:
        dy: the output gradient, shaped as x.
        x: the forward's input, (N, C, *).
        mean: C values, the forward's.
        invstd: C values, the forward's.
        weight: C values; None: 1.
        sum_dy: C values, from :func:`bn_backward_reduce` (summed over ranks under SyncBN).
        sum_dy_xhat: C values, likewise.
        count: the global per-channel element count (may exceed the local one under SyncBN).

    Returns:
        dx, shaped as x.
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


# ---- fused BN -> activation: the element-wise passes of BN with the activation (and a residual add) folded in
ACTIVATIONS = ("identity", "relu", "relu6", "silu", "hswish")
"""The activations the fused BN -> activation ops take."""
# What the backward reads for the derivative act'(pre): the forward's output y for ReLU / ReLU6 (y > 0, 0 < y < 6);
# for SiLU / HSwish the pre-activation itself, which y does not determine, recomputed from x, mean, invstd and
# the affine (so the backward keeps x and the per-channel tensors, not y); nothing for the identity.
OUTPUT_GRAD_ACTIVATIONS = ("relu", "relu6")
"""The activations whose backward reads the forward's output y."""
PRE_GRAD_ACTIVATIONS = ("silu", "hswish")  # no residual form: the backward has no shortcut to recompute pre with
"""The activations whose backward recomputes the pre-activation from x (no shortcut form)."""


def _check_act(act):
    if act not in ACTIVATIONS:
        raise ValueError(f"fused BN activation must be one of {ACTIVATIONS}, got {act!r}")


def _check_like(t, x, name):
    _check(t, name)
    if tuple(t.shape) != tuple(x.shape):
        raise ValueError(f"{name} must have x's shape {tuple(x.shape)}, got {tuple(t.shape)}")


def _check_backward(dy, y, x, act):
    _check(x)
    _check_act(act)
    _check_like(dy, x, "dy")
    if y is not None:
        _check_like(y, x, "y")
    elif act in OUTPUT_GRAD_ACTIVATIONS:
        raise ValueError(f"the {act} backward reads the forward's output y: got None")


def _one_dtype(*ts):
    """The kernels take one element dtype: float32 for all when they differ (None entries kept)."""
    if len({t.dtype for t in ts if t is not None}) <= 1:
        return ts
    return tuple(None if t is None else t.astype("float32") for t in ts)


def _checked_input(x, shortcut, act):
    """``(x, shortcut)`` of a fused forward, checked, in one dtype (shortcut may be None)."""
    _check(x)
    _check_act(act)
    if shortcut is not None:
        if act in PRE_GRAD_ACTIVATIONS:
            raise ValueError(f"fused BN -> add -> {act} has no kernel (its backward would need the shortcut)")
        _check_like(shortcut, x, "shortcut")
        x, shortcut = _one_dtype(x, shortcut)
    return x, shortcut


def bn_act_normalize(x: mge.Tensor, mean: Union[mge.Tensor, np.ndarray], invstd: Union[mge.Tensor, np.ndarray],
                     weight: Optional[Union[mge.Tensor, np.ndarray]] = None,
                     bias: Optional[Union[mge.Tensor, np.ndarray]] = None, act: str = "relu",
                     shortcut: Optional[mge.Tensor] = None) -> mge.Tensor:
    """``y = act((x - mean) * invstd * weight + bias [+ shortcut])`` in one pass.

    Computed in float32 and rounded once to x's dtype (float32 when x and shortcut dtypes differ).

    Args:
        x: (N, C, *) with 2 to 5 dims, float32 or float16.
        mean: C values.
        invstd: C values.
        weight: C values; None: 1.
        bias: C values; None: 0.
        act: one of ACTIVATIONS.
        shortcut: a residual added before the activation, shaped as x; not with PRE_GRAD_ACTIVATIONS.

    Returns:
        y, shaped as x.

    Raises:
        ValueError: an unknown act, a shortcut with a PRE_GRAD_ACTIVATIONS act, or x / shortcut of another
            rank, dtype or shape.
    """
    x, shortcut = _checked_input(x, shortcut, act)
    c = x.shape[1]
    mean, invstd, weight, bias = (_per_channel(v, c) for v in (mean, invstd, weight, bias))
    if backend() == "kernel" and kernel.ready(x, shortcut, mean, invstd, weight, bias):
        return kernel.act_normalize(x, shortcut, mean, invstd, weight, bias, act)
    return fallback.act_normalize(x, shortcut, mean, invstd, weight, bias, act)


def bn_act_backward_reduce(dy: mge.Tensor, y: Optional[mge.Tensor], x: mge.Tensor, mean: Union[mge.Tensor, np.ndarray],
                           invstd: Union[mge.Tensor, np.ndarray], act: str = "relu",
                           weight: Optional[Union[mge.Tensor, np.ndarray]] = None,
                           bias: Optional[Union[mge.Tensor, np.ndarray]] = None) -> Tuple[mge.Tensor, mge.Tensor]:
    """Per-channel ``(sum(dz), sum(dz * xhat))``, ``dz = act'(pre) * dy``, float32 (C,).

    Args:
        dy: the output gradient, shaped as x.
        y: the forward's output, read for the derivative of ReLU (``y > 0``) and ReLU6 (``0 < y < 6``); may
            be None otherwise.
        x: the forward's input.
        mean: C values, the forward's.
        invstd: C values, the forward's.
        act: one of ACTIVATIONS.
        weight: the forward's (None: 1); SiLU / HSwish take the derivative at
            ``pre = (x - mean) * invstd * weight + bias``, recomputed here.
        bias: the forward's (None: 0).

    Returns:
        ``(sum_dz, sum_dz_xhat)``.
    """
    _check_backward(dy, y, x, act)
    c = x.shape[1]
    mean, invstd, weight, bias = (_per_channel(v, c) for v in (mean, invstd, weight, bias))
    if backend() == "kernel":
        dy, y, x = _one_dtype(dy, y, x)
        if kernel.ready(x, dy, y, mean, invstd, weight, bias):
            return kernel.act_backward_reduce(dy, y, x, mean, invstd, weight, bias, act)
    return fallback.act_backward_reduce(dy, y, x, mean, invstd, weight, bias, act)


def bn_act_backward_elemt(dy: mge.Tensor, y: Optional[mge.Tensor], x: mge.Tensor, mean: Union[mge.Tensor, np.ndarray],
                          invstd: Union[mge.Tensor, np.ndarray], weight: Optional[Union[mge.Tensor, np.ndarray]],
                          sum_dz: Union[mge.Tensor, np.ndarray], sum_dz_xhat: Union[mge.Tensor, np.ndarray],
                          count: float, act: str = "relu", shortcut_grad: bool = False,
                          bias: Optional[Union[mge.Tensor, np.ndarray]] = None
                          ) -> Union[mge.Tensor, Tuple[mge.Tensor, mge.Tensor]]:
    """``dx = w * invstd * (dz - sum_dz/count - xhat * sum_dz_xhat/count)``, ``dz = act'(pre) * dy``, in dy's dtype.

    Args:
        dy: the output gradient, shaped as x.
        y: as in :func:`bn_act_backward_reduce`.
        x: the forward's input.
        mean: C values, the forward's.
        invstd: C values, the forward's.
        weight: C values; None: 1.
        sum_dz: C values, from :func:`bn_act_backward_reduce` (summed over ranks under SyncBN).
        sum_dz_xhat: C values, likewise.
        count: as in :func:`bn_backward_elemt`.
        act: one of ACTIVATIONS.
        shortcut_grad: also return the residual branch's gradient ``dshortcut = dz`` (from the same pass).
        bias: as in :func:`bn_act_backward_reduce`.

    Returns:
        ``dx``, or ``(dx, dshortcut)`` with ``shortcut_grad``.
    """
    _check_backward(dy, y, x, act)
    c = x.shape[1]
    mean, invstd, weight, bias, sum_dz, sum_dz_xhat = (
        _per_channel(v, c) for v in (mean, invstd, weight, bias, sum_dz, sum_dz_xhat))
    args = (mean, invstd, weight, bias, sum_dz, sum_dz_xhat, float(count), act, shortcut_grad)
    if backend() == "kernel":
        out_dtype = dy.dtype
        dy, y, x = _one_dtype(dy, y, x)
        if kernel.ready(x, dy, y, mean, invstd, weight, bias, sum_dz, sum_dz_xhat):
            outs = kernel.act_backward_elemt(dy, y, x, *args)
        else:
            outs = fallback.act_backward_elemt(dy, y, x, *args)
        outs = tuple(t if t.dtype == out_dtype else t.astype(out_dtype) for t in outs)
    else:
        outs = fallback.act_backward_elemt(dy, y, x, *args)
    return outs if shortcut_grad else outs[0]


# ---- one-call local training passes: the statistics and the element-wise passes of a local (not SyncBN) layer
def _check_count(count, x):
    if count <= 1:
        raise ValueError(f"BatchNorm: expected more than 1 value per channel when training, got a local count of "
                         f"{count} (input {tuple(x.shape)})")


def bn_act_train_forward(x: mge.Tensor, weight: Optional[Union[mge.Tensor, np.ndarray]] = None,
                         bias: Optional[Union[mge.Tensor, np.ndarray]] = None, eps: float = 1e-5, act: str = "identity",
                         shortcut: Optional[mge.Tensor] = None) -> Tuple[mge.Tensor, ...]:
    """Local batch-statistics BN -> act [+ shortcut], with the batch statistics.

    The values of :func:`bn_stats` then :func:`bn_act_normalize`. On CPU one kernel call that finishes each channel
    before the next (its second pass reads the channel from cache); on GPU and in the fallback those ops in turn.

    Args:
        x: (N, C, *) with 2 to 5 dims, float32 or float16; more than one value per channel.
        weight: C values in any shape (a BN parameter's (1, C, 1, 1) as it is); None: 1.
        bias: likewise; None: 0.
        eps: added to the variance.
        act: one of ACTIVATIONS.
        shortcut: a residual added before the activation, as in :func:`bn_act_normalize`.

    Returns:
        ``(y, mean, m2, invstd)``: float32 (C,) statistics with ``invstd = 1 / sqrt(m2 / count + eps)``
        (count = :func:`channel_count`).

    Raises:
        ValueError: one value per channel or fewer, or arguments :func:`bn_act_normalize` refuses.
    """
    x, shortcut = _checked_input(x, shortcut, act)
    _check_count(channel_count(x), x)
    c = x.shape[1]
    weight, bias = _channel_values(weight, c), _channel_values(bias, c)
    if backend() == "kernel" and kernel.ready_on_cpu(x, shortcut, weight, bias):
        return kernel.act_train_forward(x, shortcut, weight, bias, float(eps), act)
    mean, m2 = bn_stats(x)
    invstd = (m2 * (1.0 / channel_count(x)) + float(eps)) ** -0.5
    return bn_act_normalize(x, mean, invstd, weight, bias, act, shortcut), mean, m2, invstd


def bn_act_train_forward_update(x: mge.Tensor, weight: Optional[Union[mge.Tensor, np.ndarray]],
                                bias: Optional[Union[mge.Tensor, np.ndarray]], eps: float, act: str,
                                shortcut: Optional[mge.Tensor], running_mean: mge.Tensor, running_var: mge.Tensor,
                                bad: mge.Tensor, keep: float) -> Tuple[mge.Tensor, ...]:
    """:func:`bn_act_train_forward` and :func:`bn_running_update` of the running statistics with its mean and
    unbiased variance ``m2 * (1 / (count - 1))`` (float32, as the layers compute it). On CPU one kernel call.

    Args:
        x: as in :func:`bn_act_train_forward`.
        weight: as there.
        bias: as there.
        eps: as there.
        act: as there.
        shortcut: as there.
        running_mean: C float32 values in any shape, as in :func:`bn_running_update`.
        running_var: likewise.
        bad: the int32 (1,) count of refused updates.
        keep: the momentum, weight of the old running value.

    Returns:
        ``(y, mean, m2, invstd, running_mean', running_var', bad')``, the same values as those two calls.

    Raises:
        ValueError: running statistics of another channel count, or arguments the two ops refuse.
    """
    c = x.shape[1]
    for name, t in (("running_mean", running_mean), ("running_var", running_var)):
        if math.prod(t.shape) != c:
            raise ValueError(f"bn_act_train_forward_update: {name} has shape {tuple(t.shape)}, x has {c} channels")
    xc, sc = _checked_input(x, shortcut, act)
    _check_count(channel_count(xc), xc)
    w, b = _channel_values(weight, c), _channel_values(bias, c)
    if backend() == "kernel" and kernel.ready_on_cpu(xc, sc, w, b, running_mean, running_var, bad):
        return kernel.act_train_forward_update(xc, sc, w, b, float(eps), act, running_mean, running_var, bad, keep)
    y, mean, m2, invstd = bn_act_train_forward(x, weight, bias, eps, act, shortcut)
    var = m2 * (1.0 / (channel_count(x) - 1.0))
    return (y, mean, m2, invstd) + bn_running_update(running_mean, running_var, mean, var, keep, bad)


def bn_act_train_backward(dy: mge.Tensor, y: Optional[mge.Tensor], x: mge.Tensor, mean: Union[mge.Tensor, np.ndarray],
                          invstd: Union[mge.Tensor, np.ndarray], weight: Optional[Union[mge.Tensor, np.ndarray]] = None,
                          bias: Optional[Union[mge.Tensor, np.ndarray]] = None, act: str = "identity",
                          shortcut_grad: bool = False) -> Tuple[Optional[mge.Tensor], ...]:
    """The backward of :func:`bn_act_train_forward`, as :func:`bn_act_backward_reduce` then
    :func:`bn_act_backward_elemt` with the local count. On CPU one kernel call, channel by channel.

    Args:
        dy: the output gradient, shaped as x.
        y: as in :func:`bn_act_backward_reduce`.
        x: the forward's input.
        mean: the forward's.
        invstd: the forward's.
        weight: the forward's; None: 1.
        bias: as in :func:`bn_act_backward_reduce`.
        act: one of ACTIVATIONS.
        shortcut_grad: also return the residual branch's gradient.

    Returns:
        ``(dx, dshortcut or None, sum_dz, sum_dz_xhat)``: dx in dy's dtype; the sums (= dbias, dweight) float32
        in ``weight``'s shape, (C,) without one.
    """
    _check_backward(dy, y, x, act)
    c = x.shape[1]
    mean, invstd, weight, bias = (_channel_values(v, c) for v in (mean, invstd, weight, bias))
    if backend() == "kernel":
        out_dtype = dy.dtype
        dy, y, x = _one_dtype(dy, y, x)
        if kernel.ready_on_cpu(x, dy, y, mean, invstd, weight, bias):
            dx, ds, s1, s2 = kernel.act_train_backward(dy, y, x, mean, invstd, weight, bias, act, shortcut_grad)
            dx, ds = (t if t is None or t.dtype == out_dtype else t.astype(out_dtype) for t in (dx, ds))
            return dx, ds, s1, s2
    s1, s2 = bn_act_backward_reduce(dy, y, x, mean, invstd, act, weight, bias)
    grads = bn_act_backward_elemt(dy, y, x, mean, invstd, weight, s1, s2, channel_count(x), act, shortcut_grad, bias)
    dx, ds = grads if shortcut_grad else (grads, None)
    if weight is not None and tuple(weight.shape) != (c,):  # the kernel's shape for the sums
        s1, s2 = s1.reshape(weight.shape), s2.reshape(weight.shape)
    return dx, ds, s1, s2


def bn_running_update(running_mean: mge.Tensor, running_var: mge.Tensor, mean: mge.Tensor, var: mge.Tensor, keep: float,
                      bad: mge.Tensor) -> Tuple[mge.Tensor, mge.Tensor, mge.Tensor]:
    """One layer's guarded running-statistics update.

    When every value of ``mean`` and ``var`` is finite, ``running * keep + batch * (1 - keep)`` (float32 products
    and sum, as MegEngine's ops round them); otherwise the running values, bit for bit, and ``bad + 1``. On CPU
    one kernel call instead of ~20 small MegEngine ops; the two paths give the same bits on x86-64.

    Args:
        running_mean: float32, any shape (e.g. MegEngine's (1, C, 1, 1)).
        running_var: likewise.
        mean: the batch mean, float32, as many values.
        var: the batch's unbiased variance, likewise.
        keep: the momentum, weight of the old running value.
        bad: the int32 (1,) count of refused updates.

    Returns:
        ``(running_mean', running_var', bad')`` in the running statistics' shape.

    Raises:
        ValueError: mean or var of another size than the running statistics.
    """
    shape = tuple(running_mean.shape)
    for name, t in (("mean", mean), ("var", var)):
        if math.prod(t.shape) != math.prod(shape):
            raise ValueError(f"bn_running_update: {name} has shape {tuple(t.shape)}, the running statistics {shape}")
    if backend() == "kernel" and kernel.ready_on_cpu(running_mean, running_var, mean, var, bad):
        return kernel.running_update(running_mean, running_var, mean, var, keep, bad)  # reads values, not shapes
    mean, var = (t if tuple(t.shape) == shape else t.reshape(shape) for t in (mean, var))
    return fallback.running_update(running_mean, running_var, mean, var, keep, bad)
