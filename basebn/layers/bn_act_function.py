"""The fused BN -> activation autodiff Functions (BN [+ shortcut] -> act on :mod:`basebn.ops.bn_ops`' fused ops),
and the forward built on them.

The statistics are :mod:`.bn_function`'s, unchanged (local, or SyncBN's one ``all_gather`` forward and one
``all_reduce_sum`` backward); only the element-wise passes are fused. The backward keeps ``x`` (the BN
input) and the per-channel statistics and affine; for ReLU / ReLU6 also ``y`` (the output, which the next layer
keeps anyway), the activation's derivative being read from it; SiLU / HSwish recompute the pre-activation from
``x`` in the backward kernels instead (``y`` does not determine it; ``bn_ops.PRE_GRAD_ACTIVATIONS``). The
pre-activation tensor and the sum before a residual ReLU are never kept.
:func:`kernel_bn_act_forward` is the forward of :class:`.bn_act.BatchNormAct2d` and its SyncBN form.
"""
import megengine.functional as F
from megengine.autodiff import Function

from .. import distributed as dist
from ..ops import bn_ops
from .bn_function import _affine_args, _BNTrainFunction, _empty_like, _prepare_record, _record, _zeros_c
from ..ops.kernel_library import has_values

__all__ = ["kernel_bn_act_forward"]


class _ActBackward:
    """Backward of ``y = act(bn(x) [+ shortcut])``; a subclass sets ``mean``, ``invstd``, ``act``, ``residual``
    and supplies ``_global_sums(sum_dz, sum_dz_xhat) -> (sum_dz, sum_dz_xhat, count)``."""

    one_call = False  # set by a local training forward: the backward is one op too

    def _split(self, rest):
        """``(shortcut, weight, bias)`` from the forward's arguments after ``x``."""
        shortcut, rest = (rest[0], rest[1:]) if self.residual else (None, rest)
        weight, bias = rest if rest else (None, None)
        return shortcut, weight, bias

    def _normalize(self, x, shortcut, weight, bias):
        if not has_values(x):
            return self._keep(x, weight, bias, _empty_like(x))
        y = bn_ops.bn_act_normalize(x, self.mean, self.invstd, weight, bias, act=self.act, shortcut=shortcut)
        return self._keep(x, weight, bias, y)

    def _keep(self, x, weight, bias, y):
        """Save for the backward: x, weight, and y (ReLU / ReLU6: act' from the output) or bias (SiLU / HSwish:
        act' at the pre-activation, recomputed from x, the statistics, weight and bias); returns y."""
        self.x, self.weight, self.has_affine = x, weight, weight is not None
        self.bias = bias if self.act in bn_ops.PRE_GRAD_ACTIVATIONS else None
        self.y = y if self.act in bn_ops.OUTPUT_GRAD_ACTIVATIONS else None
        return y

    def backward(self, dy):
        x, y, c = self.x, self.y, self.x.shape[1]
        if dy is None:
            dy = F.zeros(x.shape, dtype=x.dtype)
        if self.one_call:  # the local backward in one op
            dx, ds, sum_dz, sum_dz_xhat = bn_ops.bn_act_train_backward(
                dy, y, x, self.mean, self.invstd, self.weight, self.bias, self.act, shortcut_grad=self.residual)
            self.x = self.y = self.weight = self.bias = None
            grads = (dx, ds) if self.residual else (dx,)
            if self.has_affine:  # (the sums have the weight's shape)
                return grads + (sum_dz_xhat, sum_dz)
            return grads if self.residual else dx
        if has_values(x):
            sum_dz, sum_dz_xhat = bn_ops.bn_act_backward_reduce(dy, y, x, self.mean, self.invstd, act=self.act,
                                                                weight=self.weight, bias=self.bias)
        else:  # an empty rank still returns (and, when synchronised, contributes) zero sums
            sum_dz, sum_dz_xhat = _zeros_c(c, x.device), _zeros_c(c, x.device)
        g_dz, g_dz_xhat, count = self._global_sums(sum_dz, sum_dz_xhat)
        if has_values(x):
            grads = bn_ops.bn_act_backward_elemt(dy, y, x, self.mean, self.invstd, self.weight, g_dz, g_dz_xhat,
                                                 count, act=self.act, shortcut_grad=True, bias=self.bias)
            grads = grads if self.residual else grads[:1]
        else:
            grads = (_empty_like(dy),) * (2 if self.residual else 1)
        self.x = self.y = self.weight = self.bias = None  # free the saved tensors early
        if self.has_affine:  # dweight = sum(dz * xhat), dbias = sum(dz): this rank's share
            return grads + (sum_dz_xhat, sum_dz)
        return grads if self.residual else grads[0]


class _BNActTrainFunction(_ActBackward, _BNTrainFunction):
    """Batch-statistics BN -> act [+ shortcut] (synchronised when ``sync``): ``forward(x[, shortcut][, weight,
    bias])``. ``batch_mean`` / ``batch_var`` / ``count`` as :class:`.bn_function._BNTrainFunction`'s."""

    def __init__(self, eps, sync, group, act, residual):
        super().__init__(eps, sync, group)
        self.act, self.residual = act, residual

    def forward(self, x, *rest):
        shortcut, weight, bias = self._split(rest)
        if not self.sync:  # statistics and y in one op
            return self._keep(x, weight, bias, self._local_forward(x, weight, bias, self.act, shortcut))
        self._batch_statistics(x)
        return self._normalize(x, shortcut, weight, bias)

    def _global_sums(self, sum_dz, sum_dz_xhat):
        if self.sync:  # one collective for both sums, as the unfused SyncBN
            c = sum_dz.shape[0]
            total = dist.all_reduce_sum(F.concat([sum_dz, sum_dz_xhat]), group=self.group)
            sum_dz, sum_dz_xhat = total[:c], total[c:]
        return sum_dz, sum_dz_xhat, self.count


class _BNActEvalFunction(_ActBackward, Function):
    """BN -> act [+ shortcut] with fixed (running) statistics: ``dx = act'(y) * dy * invstd * weight``."""

    def __init__(self, mean, invstd, act, residual):
        super().__init__()
        self.mean, self.invstd, self.act, self.residual = mean, invstd, act, residual

    def forward(self, x, *rest):
        return self._normalize(x, *self._split(rest))

    def _global_sums(self, sum_dz, sum_dz_xhat):
        zeros = F.zeros_like(sum_dz)  # no batch-statistics terms: dx = a * dz
        return zeros, zeros, 1.0


def kernel_bn_act_forward(bn, inp, act, shortcut=None, sync=False, group=None):
    """``act(bn(inp) [+ shortcut])`` for a ``_BatchNorm``-like ``bn`` on the fused ops (input checked).

    As :func:`.bn_function.kernel_bn_forward`: running statistics in eval / ``freeze`` (affine detached
    with ``freeze``), else batch statistics (over the ranks of ``group`` when ``sync``), recorded through
    :func:`.bn_guard.record_batch` in training (or, for a local layer, updated inside its training op). Ghost BN
    and Batch Renormalization are not fused (the layer runs them unfused).
    """
    if not bn._track_running_stats_saved and bn.track_running_stats:
        raise AssertionError("track_running_stats can not be initialised to False and changed to True later")
    c, residual = bn.num_features, shortcut is not None
    extra = (shortcut,) if residual else ()
    if bn.track_running_stats and (bn.freeze or not bn.training):
        invstd = (bn.running_var.reshape(c) + bn.eps) ** -0.5
        fn = _BNActEvalFunction(bn.running_mean.reshape(c).detach(), invstd.detach(), act, residual)
        return fn(inp, *extra, *_affine_args(bn, detach=bn.freeze))
    fn = _BNActTrainFunction(bn.eps, sync, group, act, residual)
    record = bn.training and bn.track_running_stats
    _prepare_record(fn, bn, record, local=not sync)
    out = fn(inp, *extra, *_affine_args(bn, flat=sync))
    if record:
        _record(fn, bn)
    return out
