"""The BatchNorm autodiff Functions on :mod:`basebn.layers.bn_ops`, and the forward built on them.

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
from . import bn_ops
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
        if x.size > 0:
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

    def forward(self, x, weight=None, bias=None):
        self.local_count = bn_ops.channel_count(x)
        if self.sync:
            self._synchronised_statistics(x)
        else:
            self._local_statistics(x)
        self._save(x, weight)
        if self.local_count == 0:
            return _empty_like(x)
        return bn_ops.bn_normalize(x, self.mean, self.invstd, weight, bias)

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


class _BNEvalFunction(_BNFunction):
    """``y = (x - mean) * invstd * weight + bias`` with fixed (running) statistics; no collective."""

    def __init__(self, mean, invstd):
        super().__init__()
        self.mean, self.invstd = mean, invstd

    def forward(self, x, weight=None, bias=None):
        self._save(x, weight)
        if x.size == 0:
            return _empty_like(x)
        return bn_ops.bn_normalize(x, self.mean, self.invstd, weight, bias)

    def _input_grad(self, dy, sum_dy, sum_dy_xhat):
        if dy.size == 0:
            return _empty_like(dy)
        # dx = dy * invstd * weight: bn_normalize with a zero mean and no bias
        return bn_ops.bn_normalize(dy, _zeros_c(dy.shape[1], dy.device), self.invstd, self.weight, None)


def _affine_args(bn, detach=False):
    if not bn.affine:
        return ()
    c = bn.num_features
    w, b = bn.weight.reshape(c), bn.bias.reshape(c)
    if detach:
        w, b = w.detach(), b.detach()
    return (w, b)


def _update_running_stats(bn, mean, var):
    """``running = keep * running + (1 - keep) * batch`` (MegEngine's momentum; ``None``: cumulative)."""
    bn.num_batches_tracked = getattr(bn, "num_batches_tracked", 0) + 1
    keep = 1.0 - 1.0 / bn.num_batches_tracked if bn.momentum is None else float(bn.momentum)
    shape = tuple(bn.running_mean.shape)
    bn.running_mean[...] = (bn.running_mean * keep + mean.reshape(shape) * (1.0 - keep)).detach()
    bn.running_var[...] = (bn.running_var * keep + var.reshape(shape) * (1.0 - keep)).detach()


def kernel_bn_forward(bn, inp, sync=False, group=None):
    """The forward of a ``_BatchNorm``-like module ``bn`` on :mod:`bn_ops` (input already checked).

    Running statistics when ``bn`` uses them (eval, ``freeze``: affine detached), else batch
    statistics, over all ranks of ``group`` when ``sync``; in training with running statistics they
    are updated with the unbiased batch variance, as MegEngine's BatchNorm does.
    """
    if not bn._track_running_stats_saved and bn.track_running_stats:
        raise AssertionError("track_running_stats can not be initialised to False and changed to True later")
    c = bn.num_features
    if bn.track_running_stats and (bn.freeze or not bn.training):
        invstd = (bn.running_var.reshape(c) + bn.eps) ** -0.5
        fn = _BNEvalFunction(bn.running_mean.reshape(c).detach(), invstd.detach())
        return fn(inp, *_affine_args(bn, detach=bn.freeze))
    # training, or eval with track_running_stats=False: batch statistics
    fn = _BNTrainFunction(bn.eps, sync, group)
    out = fn(inp, *_affine_args(bn))
    if bn.training and bn.track_running_stats:
        _update_running_stats(bn, fn.batch_mean, fn.batch_var)
    return out
