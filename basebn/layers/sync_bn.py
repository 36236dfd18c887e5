"""Synchronised BatchNorm over :mod:`basebn.distributed` (NCCL on GPU, MPI on CPU, identity alone).

:class:`SyncBatchNorm` normalises with the statistics of the *global* batch (all ranks of the
group) and is built on the raw ops of :mod:`basebn.layers.bn_ops` in every case, one process too:

* training forward: local ``bn_stats`` -> ONE ``all_gather`` of the packed per-rank buffer
  ``[count_hi, count_lo, mean(C), m2(C)]`` (float32; the count is split as
  ``hi * 2**20 + lo`` so it stays exact in float32 up to 2**44) -> Chan's parallel combine of
  (count, mean, M2) in float64 on the host, the same arithmetic in the same order on every rank, so
  every rank gets bit-identical statistics -> ``bn_normalize``;
* training backward: local ``bn_backward_reduce`` -> ONE ``all_reduce_sum`` of the packed
  ``[sum_dy(C), sum_dy_xhat(C)]`` -> ``bn_backward_elemt`` with the global count. The parameter
  gradients are each rank's own share (``dweight = sum(dy * xhat)``, ``dbias = sum(dy)`` over the
  local batch); the data-parallel gradient all-reduce adds them up.

Ranks may hold different batch sizes (the combine weights by count) and a rank may hold none: it
still takes part in both collectives and returns an empty output (and an empty ``dx``).

Running statistics use the global count: ``running = momentum * running + (1 - momentum) * batch``
(MegEngine's convention) with the unbiased variance ``M2 / (count - 1)``. ``momentum=None`` is the
cumulative moving average over the batches seen so far, counted by the plain Python attribute
``num_batches_tracked`` -- NOT a buffer, so the state dict stays exactly that of
``megengine.module.BatchNorm2d`` (weight, bias, running_mean, running_var; shapes (1, C, 1, 1),
reported as (C,) by ``state_dict()`` like every MegEngine BN). The counter therefore is not saved:
it restarts at 0 after loading a checkpoint (or after :meth:`reset_running_stats`).

Eval mode never communicates: it normalises with the running statistics, or -- when
``track_running_stats=False`` -- with the statistics of the local batch (like
``torch.nn.SyncBatchNorm``; collectives in eval would deadlock ranks whose evaluation loops run a
different number of batches). ``freeze=True`` behaves like MegEngine's: running statistics in train
mode too, weight and bias detached.

A global batch with at most one value per channel raises ``ValueError`` on every rank (after the
collective, so no rank is left waiting), as the unbiased variance is undefined.

Only the GPU transport is untested (see :mod:`basebn.distributed.nccl`); on GPU the forward reads the
gathered statistics back to the host once per layer (a small synchronisation).
"""
import numpy as np

import megengine as mge
import megengine.functional as F
import megengine.module as M
from megengine.autodiff import Function
from megengine.module.batchnorm import _BatchNorm

from .. import distributed as dist
from . import bn_ops

__all__ = ["SyncBatchNorm", "convert_sync_batchnorm", "revert_sync_batchnorm"]

_SPLIT = float(2 ** 20)  # count = hi * 2**20 + lo, both exact in float32


def _empty_like(x):
    return mge.tensor(np.zeros(tuple(x.shape), dtype=np.dtype(x.dtype)), device=x.device)


def _zeros_c(c, device):
    return mge.tensor(np.zeros((c,), dtype=np.float32), device=device)


def _combine(gathered, c):
    """Chan's parallel combine of a gathered (W, 2 + 2C) buffer -> (count, mean, m2) in float64."""
    g = np.asarray(gathered, dtype=np.float64)
    counts = g[:, 0] * _SPLIT + g[:, 1]
    means, m2s = g[:, 2:2 + c], g[:, 2 + c:2 + 2 * c]
    n = counts.sum()
    if n <= 0:
        return 0.0, np.zeros(c), np.zeros(c)
    mean = (counts[:, None] * means).sum(axis=0) / n
    m2 = m2s.sum(axis=0) + (counts[:, None] * (means - mean) ** 2).sum(axis=0)
    return float(n), mean, m2


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
    statistics are available as ``self.count``, ``self.batch_mean``, ``self.batch_m2`` (float64).
    """

    def __init__(self, eps, sync, group):
        super().__init__()
        self.eps = float(eps)
        self.sync = sync
        self.group = group

    def forward(self, x, weight=None, bias=None):
        c = x.shape[1]
        local_count = int(np.prod(x.shape)) // c if c else 0
        if local_count > 0:
            mean, m2 = bn_ops.bn_stats(x)
        else:  # an empty rank never reaches the ops; it still joins the collective below
            mean, m2 = _zeros_c(c, x.device), _zeros_c(c, x.device)
        hi = float(local_count // int(_SPLIT))
        lo = float(local_count - int(hi) * int(_SPLIT))
        packed = F.concat([mge.tensor(np.array([hi, lo], dtype=np.float32), device=x.device),
                           mean.astype("float32"), m2.astype("float32")])
        if self.sync:
            gathered = dist.all_gather(packed, group=self.group)
        else:
            gathered = packed.reshape(1, -1)
        count, gmean, gm2 = _combine(gathered.numpy(), c)
        if count <= 1:
            raise ValueError(
                f"SyncBatchNorm: expected more than 1 value per channel when training, got a "
                f"{'global' if self.sync else 'local'} count of {int(count)} (input {tuple(x.shape)})"
            )
        invstd = 1.0 / np.sqrt(gm2 / count + self.eps)
        self.count, self.batch_mean, self.batch_m2 = count, gmean, gm2
        self.local_count = local_count
        self.mean = mge.tensor(gmean.astype(np.float32), device=x.device)
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
                                        total[:c], total[c:], self.count)


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
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.9, affine=True,
                 track_running_stats=True, group=None, freeze=False, **kwargs):
        super().__init__(num_features, eps=eps, momentum=0.9 if momentum is None else momentum,
                         affine=affine, track_running_stats=track_running_stats, freeze=freeze,
                         **kwargs)
        self.momentum = momentum
        self.group = group
        self.num_batches_tracked = 0  # plain attribute: not part of the state dict (see module doc)

    def reset_running_stats(self):
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

        sync = self.training  # eval with track_running_stats=False: local batch statistics
        fn = _BNTrainFunction(self.eps, sync, self.group)
        out = fn(inp, *self._affine_args())
        if self.training and self.track_running_stats:
            self._update_running_stats(fn.count, fn.batch_mean, fn.batch_m2)
        return out

    def _update_running_stats(self, count, mean, m2):
        self.num_batches_tracked += 1
        if self.momentum is None:
            keep = 1.0 - 1.0 / self.num_batches_tracked
        else:
            keep = float(self.momentum)
        shape = tuple(self.running_mean.shape)
        var = (m2 / (count - 1.0)).astype(np.float32).reshape(shape)
        mean = mean.astype(np.float32).reshape(shape)
        dev = self.running_mean.device
        new_mean = self.running_mean * keep + mge.tensor(mean, device=dev) * (1.0 - keep)
        new_var = self.running_var * keep + mge.tensor(var, device=dev) * (1.0 - keep)
        self.running_mean[...] = new_mean.detach()
        self.running_var[...] = new_var.detach()

    def _module_info_string(self):
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"track_running_stats={self.track_running_stats}")


# ------------------------------------------------------------------------------- conversion
_BN_TYPES = (M.BatchNorm1d, M.BatchNorm2d, M.SyncBatchNorm)


def _transfer(src, dst):
    """Move ``src``'s tensors (the same Parameter/buffer objects, so an optimizer built on them
    keeps working), flags, names and hooks onto ``dst``."""
    if src.affine:
        dst.weight, dst.bias = src.weight, src.bias
    if src._track_running_stats_saved:
        dst.running_mean, dst.running_var = src.running_mean, src.running_var
    dst.track_running_stats = src.track_running_stats
    dst.training = src.training
    dst._name, dst._short_name = src._name, src._short_name
    dst._forward_pre_hooks.update(src._forward_pre_hooks)
    dst._forward_hooks.update(src._forward_hooks)
    return dst


def _to_sync(bn, group):
    new = SyncBatchNorm(bn.num_features, eps=bn.eps, momentum=bn.momentum, affine=bn.affine,
                        track_running_stats=bn._track_running_stats_saved, group=group,
                        freeze=getattr(bn, "freeze", False), name=bn.name)
    # remember what to revert to (megengine's SyncBatchNorm reverts to a local BatchNorm2d)
    new._revert_cls = M.BatchNorm1d if isinstance(bn, M.BatchNorm1d) else M.BatchNorm2d
    return _transfer(bn, new)


def _to_plain(bn):
    cls = getattr(bn, "_revert_cls", M.BatchNorm2d)
    momentum = 0.9 if bn.momentum is None else bn.momentum  # MegEngine BN has no cumulative mode
    new = cls(bn.num_features, eps=bn.eps, momentum=momentum, affine=bn.affine,
              track_running_stats=bn._track_running_stats_saved, freeze=bn.freeze, name=bn.name)
    return _transfer(bn, new)


def _map_modules(module, fn):
    """``fn(module)`` if it returns a replacement, else recurse into the children (attributes,
    and lists/tuples/dicts of them) and swap the replaced ones in place."""
    new = fn(module)
    if new is not None:
        return new

    def walk(value):
        if isinstance(value, M.Module):
            return _map_modules(value, fn)
        if isinstance(value, (list, tuple)):
            items = [walk(v) for v in value]
            if all(a is b for a, b in zip(items, value)):
                return value
            return items if isinstance(value, list) else type(value)(items)
        if isinstance(value, dict):
            items = {k: walk(v) for k, v in value.items()}
            if all(items[k] is value[k] for k in value):
                return value
            out = type(value)()
            out.update(items)
            return out
        return value

    for key, value in list(vars(module).items()):
        if not isinstance(value, (M.Module, list, tuple, dict)):
            continue
        replaced = walk(value)
        if replaced is not value:
            setattr(module, key, replaced)
    return module


def convert_sync_batchnorm(module, group=None):
    """Replace every ``megengine.module`` BatchNorm1d / BatchNorm2d / SyncBatchNorm in ``module``
    (recursively) by a :class:`SyncBatchNorm` holding the same weight/bias/running tensors, name,
    eps, momentum, affine, freeze and train/eval flag.

    Returns the converted module: ``module`` itself, or a new object when it is a BN layer.
    Convert before building the optimizer (the Parameters are shared, so one built earlier keeps
    working too).
    """
    return _map_modules(module, lambda m: _to_sync(m, group)
                        if isinstance(m, _BN_TYPES) and not isinstance(m, SyncBatchNorm) else None)


def revert_sync_batchnorm(module):
    """Replace every :class:`SyncBatchNorm` by a local MegEngine BN with the same tensors and
    settings: the class it was converted from (BatchNorm1d or BatchNorm2d), BatchNorm2d for one
    built directly or converted from megengine's SyncBatchNorm. ``momentum=None`` becomes 0.9
    (MegEngine BN has no cumulative mode).
    """
    return _map_modules(module, lambda m: _to_plain(m) if isinstance(m, SyncBatchNorm) else None)
