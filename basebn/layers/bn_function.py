"""The BatchNorm autodiff Functions on :mod:`basebn.ops.bn_ops`, and the forward built on them.

:func:`kernel_bn_forward` is the forward of basebn's ``BatchNorm2d`` (``sync=False``) and of
``SyncBatchNorm``: running statistics in eval / ``freeze`` (:class:`_BNEvalFunction`), else batch
statistics (:class:`_BNTrainFunction`), local or synchronised over the ranks of a group (forward ONE
``all_gather`` of the packed ``[count_hi, count_lo, mean(C), m2(C)]`` row merged in float64,
backward ONE ``all_reduce_sum`` of ``[sum dy, sum dy*xhat]``), and the running-statistics update.
Design notes: docs/bn_design.md.
"""
import numpy as np

import megengine as mge
import megengine.functional as F
from megengine.autodiff import Function

from .. import distributed as dist
from ..ops import bn_ops
from .bn_guard import in_op_update_args, record_batch, store_in_op_update
from ..ops.kernel_library import has_values
from .moments import Moments, merge_all

__all__ = ["kernel_bn_forward"]

_SPLIT = float(2 ** 20)  # count = hi * 2**20 + lo, both exact in float32


def _empty_like(x):
    return mge.tensor(np.zeros(tuple(x.shape), dtype=np.dtype(x.dtype)), device=x.device)


def _zeros_c(c, device):
    return mge.tensor(np.zeros((c,), dtype=np.float32), device=device)


def _pack(count, mean, m2, device):
    """One float32 row ``[count_hi, count_lo, mean(C), m2(C)]`` (the count exact up to 2**44)."""
    hi = float(count // int(_SPLIT))
    lo = float(count - int(hi) * int(_SPLIT))
    return F.concat([mge.tensor(np.array([hi, lo], dtype=np.float32), device=device),
                     mean.astype("float32"), m2.astype("float32")])


def _unpack(rows, c):
    """The :class:`Moments` of each packed row, in float64."""
    g = np.asarray(rows, dtype=np.float64)
    return [Moments(r[0] * _SPLIT + r[1], r[2:2 + c], r[2 + c:2 + 2 * c]) for r in g]


class _BNFunction(Function):
    """Shared backward scaffold: forward saves ``x``, ``weight``, ``mean``, ``invstd``; a subclass
    supplies ``_input_grad(dy, sum_dy, sum_dy_xhat)``, which returns ``dx`` from the local sums."""

    def _save(self, x, weight):
        self.x, self.weight, self.has_affine = x, weight, weight is not None

    def _input_grad(self, dy, sum_dy, sum_dy_xhat):
        raise NotImplementedError

    def backward(self, dy):
        x, c = self.x, self.x.shape[1]
        if dy is None:
            dy = F.zeros(x.shape, dtype=x.dtype)
        if has_values(x):
            sum_dy, sum_dy_xhat = bn_ops.bn_backward_reduce(dy, x, self.mean, self.invstd)
        else:  # an empty rank still returns (and, when synchronised, contributes) zero sums
            sum_dy, sum_dy_xhat = _zeros_c(c, x.device), _zeros_c(c, x.device)
        dx = self._input_grad(dy, sum_dy, sum_dy_xhat)
        self.x = self.weight = None  # free the saved input early
        if self.has_affine:  # dweight = sum(dy * xhat), dbias = sum(dy): this rank's share
            return dx, sum_dy_xhat, sum_dy
        return dx


class _BNTrainFunction(_BNFunction):
    """Batch-statistics BN (synchronised when ``sync``) with a hand-written backward.

    ``forward(x[, weight, bias])``; weight and bias are (C,) float32. After the forward the batch
    mean and unbiased variance (for the running statistics) are ``self.batch_mean`` and
    ``self.batch_var``, float32 (C,) tensors.
    """

    def __init__(self, eps, sync, group):
        super().__init__()
        self.eps = float(eps)
        self.sync = sync
        self.group = group
        self.one_call = False  # the local forward and backward each in one op (bn_ops.bn_act_train_*)
        # set before the call: (running_mean, running_var, bad, keep) to update in the local forward's op, whose
        # new values are then running_out (bn_guard.in_op_update_args / store_in_op_update)
        self.running = self.running_out = None

    def forward(self, x, weight=None, bias=None):
        if not self.sync:
            self._save(x, weight)
            return self._local_forward(x, weight, bias)
        self._batch_statistics(x)
        self._save(x, weight)
        if self.local_count == 0:
            return _empty_like(x)
        return bn_ops.bn_normalize(x, self.mean, self.invstd, weight, bias)

    def _local_forward(self, x, weight, bias, act="identity", shortcut=None):
        """Local statistics and ``act(bn(x) [+ shortcut])`` in one op (bn_ops.bn_act_train_forward)."""
        self.local_count = bn_ops.channel_count(x)
        self._check_count(self.local_count, x)
        self.count = float(self.local_count)
        if self.running is not None:
            y, self.mean, m2, self.invstd, *running_out = bn_ops.bn_act_train_forward_update(
                x, weight, bias, self.eps, act, shortcut, *self.running)
            self.running_out = tuple(running_out)
            self.batch_mean = self.batch_var = None  # (recorded in the op)
        else:
            y, self.mean, m2, self.invstd = bn_ops.bn_act_train_forward(x, weight, bias, self.eps, act, shortcut)
            self.batch_mean, self.batch_var = self.mean, m2 * (1.0 / (self.count - 1.0))
        self.one_call = True
        return y

    def backward(self, dy):
        if not self.one_call:
            return super().backward(dy)
        x = self.x
        if dy is None:
            dy = F.zeros(x.shape, dtype=x.dtype)
        dx, _, sum_dy, sum_dy_xhat = bn_ops.bn_act_train_backward(dy, None, x, self.mean, self.invstd, self.weight)
        self.x = self.weight = None  # free the saved input early
        if self.has_affine:  # (the sums have the weight's shape)
            return dx, sum_dy_xhat, sum_dy
        return dx

    def _batch_statistics(self, x):
        """mean, invstd, batch_mean, batch_var and the counts of ``x`` (over all ranks when ``sync``)."""
        self.local_count = bn_ops.channel_count(x)
        if self.sync:
            self._synchronised_statistics(x)
        else:
            self._local_statistics(x)

    def _check_count(self, count, x):
        if count <= 1:
            raise ValueError(
                f"BatchNorm: expected more than 1 value per channel when training, got a "
                f"{'global' if self.sync else 'local'} count of {int(count)} (input {tuple(x.shape)})"
            )

    def _local_statistics(self, x):
        """mean, invstd and the unbiased variance computed on the device (no host copy)."""
        self._check_count(self.local_count, x)
        self.count = float(self.local_count)
        mean, m2 = bn_ops.bn_stats(x)
        self.mean = mean
        self.invstd = (m2 * (1.0 / self.count) + self.eps) ** -0.5
        self.batch_mean, self.batch_var = mean, m2 * (1.0 / (self.count - 1.0))

    def _synchronised_statistics(self, x):
        """Every rank's [count, mean, m2], gathered and merged in float64 on the host."""
        c = x.shape[1]
        if self.local_count > 0:
            mean, m2 = bn_ops.bn_stats(x)
        else:  # an empty rank never reaches the ops; it still joins the collective below
            mean, m2 = _zeros_c(c, x.device), _zeros_c(c, x.device)
        packed = _pack(self.local_count, mean, m2, x.device)
        gathered = dist.all_gather(packed, group=self.group)
        batch = merge_all(_unpack(gathered.numpy(), c), c)
        self._check_count(batch.count, x)
        self.count = batch.count
        invstd = 1.0 / np.sqrt(batch.m2 / batch.count + self.eps)

        def tensor(v):
            return mge.tensor(np.asarray(v, dtype=np.float32), device=x.device)

        self.mean, self.invstd = tensor(batch.mean), tensor(invstd)
        self.batch_mean, self.batch_var = self.mean, tensor(batch.m2 / (batch.count - 1.0))

    def _input_grad(self, dy, sum_dy, sum_dy_xhat):
        if self.sync:  # one collective for both sums
            c = dy.shape[1]
            local = F.concat([sum_dy.astype("float32"), sum_dy_xhat.astype("float32")])
            total = dist.all_reduce_sum(local, group=self.group)
            sum_dy, sum_dy_xhat = total[:c], total[c:]
        if self.local_count == 0:
            return _empty_like(dy)
        return bn_ops.bn_backward_elemt(dy, self.x, self.mean, self.invstd, self.weight,
                                        sum_dy, sum_dy_xhat, self.count)


class _BRNTrainFunction(_BNTrainFunction):
    """Batch Renormalization (Ioffe 2017) on the BN ops: ``y = w * (r * xhat + d) + b`` with ``r``, ``d``
    per-channel constants of the gradient, folded into the normalisation's scale ``w * r`` and shift
    ``w * d + b``; ``dw = r * sum(dy * xhat) + d * sum(dy)``. Batch statistics as :class:`_BNTrainFunction`."""

    def __init__(self, eps, sync, group, running_mean, running_var, r_max, d_max):
        super().__init__(eps, sync, group)
        self.running_mean, self.running_var = running_mean, running_var
        self.r_max, self.d_max = float(r_max), float(d_max)

    def forward(self, x, weight=None, bias=None):
        self._batch_statistics(x)
        sigma = (self.running_var + self.eps) ** 0.5
        self.r = F.clip(1.0 / (self.invstd * sigma), 1.0 / self.r_max, self.r_max)
        self.d = F.clip((self.mean - self.running_mean) / sigma, -self.d_max, self.d_max)
        scale = self.r if weight is None else weight * self.r
        shift = self.d if weight is None else weight * self.d + bias
        self._save(x, scale)
        self.has_affine = weight is not None
        if self.local_count == 0:
            return _empty_like(x)
        return bn_ops.bn_normalize(x, self.mean, self.invstd, scale, shift)

    def backward(self, dy):
        grads = super().backward(dy)
        if not self.has_affine:
            return grads
        dx, sum_dy_xhat, sum_dy = grads
        return dx, sum_dy_xhat * self.r + sum_dy * self.d, sum_dy


class _BNEvalFunction(_BNFunction):
    """``y = (x - mean) * invstd * weight + bias`` with fixed (running) statistics; no collective."""

    def __init__(self, mean, invstd):
        super().__init__()
        self.mean, self.invstd = mean, invstd

    def forward(self, x, weight=None, bias=None):
        self._save(x, weight)
        if not has_values(x):
            return _empty_like(x)
        return bn_ops.bn_normalize(x, self.mean, self.invstd, weight, bias)

    def _input_grad(self, dy, sum_dy, sum_dy_xhat):
        if not has_values(dy):
            return _empty_like(dy)
        # dx = dy * invstd * weight: bn_normalize with a zero mean and no bias
        return bn_ops.bn_normalize(dy, _zeros_c(dy.shape[1], dy.device), self.invstd, self.weight, None)


def _affine_args(bn, detach=False, flat=True):
    """``(weight, bias)`` of ``bn`` (``()`` without affine): (C,) tensors, or with ``flat=False`` the parameters
    as they are (MegEngine's (1, C, 1, 1)), for the local training Functions, whose one-call ops read values, not
    shapes, and give the gradients the weight's shape: two reshapes fewer each way per layer and step."""
    if not bn.affine:
        return ()
    if flat:
        c = bn.num_features
        w, b = bn.weight.reshape(c), bn.bias.reshape(c)
    else:
        w, b = bn.weight, bn.bias
    if detach:
        w, b = w.detach(), b.detach()
    return (w, b)


def _prepare_record(fn, bn, record, local):
    """Before a training call of ``fn``: where the batch is recorded and the forward is local (one op), the running
    statistics are updated inside that op (unless :func:`.bn_guard.in_op_update_args` says otherwise)."""
    if record and local:
        fn.running = in_op_update_args(bn)


def _record(fn, bn):
    """After a training call of ``fn`` that records its batch: the update the op made, or :func:`record_batch`."""
    if fn.running_out is not None:
        store_in_op_update(bn, *fn.running_out)
    else:
        record_batch(bn, fn.batch_mean, fn.batch_var, fn.count)


def _train_function(bn, sync, group, renorm):
    if renorm is None:
        return _BNTrainFunction(bn.eps, sync, group)
    c = bn.num_features
    return _BRNTrainFunction(bn.eps, sync, group, bn.running_mean.reshape(c).detach(),
                             bn.running_var.reshape(c).detach(), *renorm)


def _grouped_statistics_forward(bn, inp, size):
    """Ghost BN of (N, C, H, W) ``inp`` in groups of ``size`` consecutive samples (N a multiple of it).

    The groups become channels of one (size, groups * C, H * W) tensor (a transpose copy), so the BN ops
    make ONE statistics and ONE normalisation pass for all groups; returns (output, (groups, C) means,
    (groups, C) unbiased variances).
    """
    n, c = inp.shape[0], inp.shape[1]
    groups = n // size
    fn = _BNTrainFunction(bn.eps, False, None)
    if groups == 1:
        out = fn(inp, *_affine_args(bn))
        return out, fn.batch_mean.reshape(1, c), fn.batch_var.reshape(1, c)
    spatial = int(np.prod(inp.shape[2:]))
    xt = F.transpose(inp.reshape(groups, size, c, spatial), (1, 0, 2, 3)).reshape(size, groups * c, spatial)
    affine = tuple(F.broadcast_to(v.reshape(1, c), (groups, c)).reshape(groups * c) for v in _affine_args(bn))
    yt = fn(xt, *affine)
    out = F.transpose(yt.reshape(size, groups, c, spatial), (1, 0, 2, 3)).reshape(inp.shape)
    return out, fn.batch_mean.reshape(groups, c), fn.batch_var.reshape(groups, c)


def _ghost_forward(bn, inp, size):
    """Batch-statistics forward in groups of ``size`` samples; a last partial group (N not a multiple of
    ``size``) is a group of its own. Returns (output, mean, unbiased var averaged over groups, groups)."""
    n = inp.shape[0]
    full = n // size * size
    outs, means, variances = [], [], []
    if full:
        out, mean, var = _grouped_statistics_forward(bn, inp if full == n else inp[:full], size)
        outs.append(out)
        means.append(F.sum(mean, axis=0))
        variances.append(F.sum(var, axis=0))
    if full < n:
        fn = _BNTrainFunction(bn.eps, False, None)
        outs.append(fn(inp[full:], *_affine_args(bn)))
        means.append(fn.batch_mean)
        variances.append(fn.batch_var)
    groups = full // size + (1 if full < n else 0)
    out = outs[0] if len(outs) == 1 else F.concat(outs, axis=0)
    mean = means[0] if len(means) == 1 else means[0] + means[1]
    var = variances[0] if len(variances) == 1 else variances[0] + variances[1]
    return out, mean / groups, var / groups, groups


def kernel_bn_forward(bn, inp, sync=False, group=None, renorm=None):
    """The forward of a ``_BatchNorm``-like module ``bn`` on :mod:`bn_ops` (input already checked).

    Running statistics when ``bn`` uses them (eval, ``freeze``: affine detached), else batch
    statistics, over all ranks of ``group`` when ``sync``; in training with running statistics they
    are updated with the unbiased batch variance, as MegEngine's BatchNorm does, through
    :func:`.bn_guard.record_batch` (non-finite guard, accumulation). ``bn.norm_batch_size`` (local BN
    only) normalises groups of that many samples (ghost BN); ``renorm=(r_max, d_max)`` is Batch
    Renormalization in training (with running statistics).
    """
    if not bn._track_running_stats_saved and bn.track_running_stats:
        raise AssertionError("track_running_stats can not be initialised to False and changed to True later")
    c = bn.num_features
    if bn.track_running_stats and (bn.freeze or not bn.training):
        invstd = (bn.running_var.reshape(c) + bn.eps) ** -0.5
        fn = _BNEvalFunction(bn.running_mean.reshape(c).detach(), invstd.detach())
        return fn(inp, *_affine_args(bn, detach=bn.freeze))
    # training, or eval with track_running_stats=False: batch statistics
    record = bn.training and bn.track_running_stats
    size = getattr(bn, "norm_batch_size", None)
    if size is not None and not sync:
        out, mean, var, groups = _ghost_forward(bn, inp, int(size))
        if record:
            record_batch(bn, mean, var, bn_ops.channel_count(inp), groups=groups)
        return out
    renorm = renorm if record else None
    fn = _train_function(bn, sync, group, renorm)
    _prepare_record(fn, bn, record, local=not sync and renorm is None)
    out = fn(inp, *_affine_args(bn, flat=sync or renorm is not None))
    if record:
        _record(fn, bn)
    return out
