"""SyncBatchNorm: BatchNorm over the global batch of all ranks (:mod:`basebn.distributed`).

Built on :mod:`basebn.layers.bn_ops`, one process too. Per training layer: forward ONE
``all_gather`` of ``[count, mean, M2]`` merged in float64 in rank order (bit-identical on every
rank), backward ONE ``all_reduce_sum`` of ``[sum dy, sum dy*xhat]``. Eval never communicates.
``num_batches_tracked`` (for ``momentum=None``) is a plain attribute, not saved, so the state
dict stays BatchNorm2d's. Design notes: docs/bn_design.md.
"""
import contextlib

import numpy as np

import megengine as mge
import megengine.functional as F
from megengine.autodiff import Function
from megengine.module.batchnorm import _BatchNorm

from .. import distributed as dist
from . import bn_ops
from .moments import Moments, merge_all

__all__ = ["SyncBatchNorm", "local_statistics"]

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
    statistics are available as ``self.batch`` (:class:`Moments`, float64).
    """

    def __init__(self, eps, sync, group):
        super().__init__()
        self.eps = float(eps)
        self.sync = sync
        self.group = group

    def forward(self, x, weight=None, bias=None):
        c = x.shape[1]
        local_count = bn_ops.channel_count(x)
        if local_count > 0:
            mean, m2 = bn_ops.bn_stats(x)
        else:  # an empty rank never reaches the ops; it still joins the collective below
            mean, m2 = _zeros_c(c, x.device), _zeros_c(c, x.device)
        packed = _pack(local_count, mean, m2, x.device)
        gathered = dist.all_gather(packed, group=self.group) if self.sync else packed.reshape(1, -1)
        batch = merge_all(_unpack(gathered.numpy(), c), c)
        if batch.count <= 1:
            raise ValueError(
                f"SyncBatchNorm: expected more than 1 value per channel when training, got a "
                f"{'global' if self.sync else 'local'} count of {int(batch.count)} (input {tuple(x.shape)})"
            )
        invstd = 1.0 / np.sqrt(batch.m2 / batch.count + self.eps)
        self.batch, self.local_count = batch, local_count
        self.mean = mge.tensor(batch.mean.astype(np.float32), device=x.device)
        self.invstd = mge.tensor(invstd.astype(np.float32), device=x.device)
        self._save(x, weight)
        if local_count == 0:
            return _empty_like(x)
        return bn_ops.bn_normalize(x, self.mean, self.invstd, weight, bias)

    def _input_grad(self, dy, sum_dy, sum_dy_xhat):
        c = dy.shape[1]
        local = F.concat([sum_dy.astype("float32"), sum_dy_xhat.astype("float32")])
        total = dist.all_reduce_sum(local, group=self.group) if self.sync else local
        if self.local_count == 0:
            return _empty_like(dy)
        return bn_ops.bn_backward_elemt(dy, self.x, self.mean, self.invstd, self.weight,
                                        total[:c], total[c:], self.batch.count)


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


class SyncBatchNorm(_BatchNorm):
    r"""BatchNorm over (N, C, \*) input (2D to 5D) with statistics synchronised across ranks.

    Same parameters and buffers as ``megengine.module.BatchNorm2d`` (``weight``, ``bias``,
    ``running_mean``, ``running_var``, each (1, C, 1, 1)), so state dicts load both ways.

    Args:
        num_features: C.
        eps: added to the variance. Default 1e-5.
        momentum: weight of the old running value (MegEngine convention, default 0.9);
            ``None`` = cumulative moving average.
        affine: learnable weight and bias.
        track_running_stats: keep running mean/var (else batch statistics in eval too, local).
        group: a :func:`basebn.distributed.new_group` group; ``None`` = all ranks.
        freeze: use the running statistics in training too, with detached weight and bias
            (MegEngine's ``freeze``).

    ``local_only`` (attribute, default False; see :func:`local_statistics`): training batches are
    normalised with this rank's statistics, without any collective.
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.9, affine=True,
                 track_running_stats=True, group=None, freeze=False, **kwargs):
        super().__init__(num_features, eps=eps, momentum=0.9 if momentum is None else momentum,
                         affine=affine, track_running_stats=track_running_stats, freeze=freeze,
                         **kwargs)
        self.momentum = momentum
        self.group = group
        self.local_only = False
        self.num_batches_tracked = 0  # plain attribute: not part of the state dict

    def reset_running_stats(self):
        """Running mean 0, variance 1, and the cumulative-average counter 0."""
        super().reset_running_stats()
        self.num_batches_tracked = 0

    def _check_input_ndim(self, inp):
        if inp.ndim < 2 or inp.ndim > 5:
            raise ValueError(f"expected 2D to 5D input (N, C, *), got {inp.ndim}D input")
        if inp.shape[1] != self.num_features:
            raise ValueError(f"expected {self.num_features} channels, got input {tuple(inp.shape)}")

    def _affine_args(self, detach=False):
        if not self.affine:
            return ()
        c = self.num_features
        w, b = self.weight.reshape(c), self.bias.reshape(c)
        if detach:
            w, b = w.detach(), b.detach()
        return (w, b)

    def forward(self, inp):
        self._check_input_ndim(inp)
        if not self._track_running_stats_saved and self.track_running_stats:
            raise AssertionError("track_running_stats can not be initialised to False and changed to True later")
        c = self.num_features
        use_running = self.track_running_stats and (self.freeze or not self.training)
        if use_running:
            mean = self.running_mean.reshape(c)
            invstd = (self.running_var.reshape(c) + self.eps) ** -0.5
            fn = _BNEvalFunction(mean.detach(), invstd.detach())
            return fn(inp, *self._affine_args(detach=self.freeze))

        # eval with track_running_stats=False, or local_only: local batch statistics
        sync = self.training and not self.local_only
        fn = _BNTrainFunction(self.eps, sync, self.group)
        out = fn(inp, *self._affine_args())
        if self.training and self.track_running_stats:
            self._update_running_stats(fn.batch)
        return out

    def _update_running_stats(self, batch):
        self.num_batches_tracked += 1
        if self.momentum is None:
            keep = 1.0 - 1.0 / self.num_batches_tracked
        else:
            keep = float(self.momentum)
        shape = tuple(self.running_mean.shape)
        var = (batch.m2 / (batch.count - 1.0)).astype(np.float32).reshape(shape)
        mean = batch.mean.astype(np.float32).reshape(shape)
        dev = self.running_mean.device
        new_mean = self.running_mean * keep + mge.tensor(mean, device=dev) * (1.0 - keep)
        new_var = self.running_var * keep + mge.tensor(var, device=dev) * (1.0 - keep)
        self.running_mean[...] = new_mean.detach()
        self.running_var[...] = new_var.detach()

    def _module_info_string(self):
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"track_running_stats={self.track_running_stats}")


@contextlib.contextmanager
def local_statistics(model):
    """Within the block, every :class:`SyncBatchNorm` of ``model`` normalises training batches with
    its local statistics (no collective), as plain BN does; yields those layers, restores after."""
    layers = [m for m in model.modules() if isinstance(m, SyncBatchNorm)]
    saved = [(m, m.local_only) for m in layers]
    for m in layers:
        m.local_only = True
    try:
        yield layers
    finally:
        for m, flag in saved:
            m.local_only = flag
