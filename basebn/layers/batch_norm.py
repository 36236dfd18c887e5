"""BatchNorm2d: MegEngine's ``M.BatchNorm2d`` computed by basebn's BN ops, in one process.

What ``build_norm("BN")`` builds. A subclass of ``M.BatchNorm2d``: the same state dict (keys,
(1, C, 1, 1) float32 tensors), momentum convention (``running = momentum * running + (1 - momentum)
* batch``, unbiased batch variance), ``freeze`` and eval behaviour, so checkpoints load both ways and
every ``isinstance(m, M.BatchNorm2d)`` still holds. The forward is SyncBatchNorm's without any
collective (:func:`.bn_function.kernel_bn_forward`): the kernels, or their fallback, and the batch
statistics stay on the device. Under ``jit.trace`` it runs MegEngine's own BN op. ``momentum=None``
is a cumulative average (``num_batches_tracked`` is a plain attribute, not saved).
``norm_batch_size`` (a plain attribute, not saved; None = the whole batch) normalises training batches in
groups of that many consecutive samples (ghost BN, docs/bn_training.md).
"""
from typing import Any, Optional

import megengine.module as M
from megengine.jit import tracing

from .bn_function import kernel_bn_forward

__all__ = ["BatchNorm2d", "check_norm_batch_size"]


def check_norm_batch_size(size: Optional[int]) -> Optional[int]:
    """``size`` as an int >= 1, or None.

    Args:
        size: a normalisation batch size, or None (the whole batch).

    Returns:
        `size` as an int, or None.

    Raises:
        ValueError: anything but None or an integer >= 1.
    """
    if size is None:
        return None
    if isinstance(size, bool) or int(size) != size or size < 1:
        raise ValueError(f"norm_batch_size must be None or an integer >= 1, got {size!r}")
    return int(size)


class BatchNorm2d(M.BatchNorm2d):
    """``megengine.module.BatchNorm2d`` (same arguments) on basebn's BN ops; see the module doc.

    Args:
        num_features: C.
        eps: added to the variance.
        momentum: weight of the old running value (MegEngine's convention); None: a cumulative average.
        affine: learnable weight and bias.
        track_running_stats: keep running mean/var (else batch statistics in eval too).
        freeze: use the running statistics in training too, with detached weight and bias.
        norm_batch_size: normalise training batches in groups of this many samples (ghost BN); None: the
            whole batch.
        **kwargs: to ``megengine.module.BatchNorm2d``.

    Raises:
        ValueError: norm_batch_size is neither None nor an integer >= 1.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: Optional[float] = 0.9, affine: bool = True,
                 track_running_stats: bool = True, freeze: bool = False, norm_batch_size: Optional[int] = None,
                 **kwargs: Any):
        super().__init__(num_features, eps=eps, momentum=0.9 if momentum is None else momentum, affine=affine,
                         track_running_stats=track_running_stats, freeze=freeze, **kwargs)
        self.momentum = momentum
        self.norm_batch_size = check_norm_batch_size(norm_batch_size)
        self.num_batches_tracked = 0  # plain attribute: not part of the state dict

    def reset_running_stats(self):
        """Running mean 0, variance 1, and the cumulative-average counter 0."""
        super().reset_running_stats()
        self.num_batches_tracked = 0

    def _check_input_ndim(self, inp):
        super()._check_input_ndim(inp)
        if inp.shape[1] != self.num_features:
            raise ValueError(f"expected {self.num_features} channels, got input {tuple(inp.shape)}")

    def forward(self, inp):
        if tracing.is_tracing():  # a traced graph holds MegEngine's BN op (same math), never a custom op
            if self.norm_batch_size is not None and self.training:
                raise ValueError("BatchNorm2d(norm_batch_size=...) cannot run under jit.trace in training")
            if self.momentum is None:
                raise ValueError("BatchNorm2d(momentum=None) (cumulative average) cannot run under jit.trace; "
                                 "give it a momentum")
            return super().forward(inp)
        self._check_input_ndim(inp)
        return kernel_bn_forward(self, inp)
