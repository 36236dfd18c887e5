"""SyncBatchNorm: BatchNorm over the global batch of all ranks (:mod:`basebn.distributed`).

Built on :func:`.bn_function.kernel_bn_forward` (the BN ops, one process too). Per training layer:
forward ONE ``all_gather`` of ``[count, mean, M2]`` merged in float64 in rank order (bit-identical
on every rank), backward ONE ``all_reduce_sum`` of ``[sum dy, sum dy*xhat]``. Eval never
communicates. Unsynchronised (local) statistics stay on the device: no host copy.
``num_batches_tracked`` (for ``momentum=None``) is a plain attribute, not saved, so the state dict
stays BatchNorm2d's. Design notes: docs/bn_design.md.
"""
import contextlib
from typing import Any, Iterator, List, Optional

import megengine.module as M
from megengine.module.batchnorm import _BatchNorm

from .bn_function import kernel_bn_forward

__all__ = ["SyncBatchNorm", "local_statistics"]


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
        **kwargs: to ``megengine.module.Module``.

    ``local_only`` (attribute, default False; see :func:`local_statistics`): training batches are
    normalised with this rank's statistics, without any collective.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: Optional[float] = 0.9, affine: bool = True,
                 track_running_stats: bool = True, group: Any = None, freeze: bool = False, **kwargs: Any):
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

    def forward(self, inp):
        self._check_input_ndim(inp)
        return kernel_bn_forward(self, inp, sync=self.training and not self.local_only, group=self.group)

    def _module_info_string(self):
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"track_running_stats={self.track_running_stats}")


@contextlib.contextmanager
def local_statistics(model: M.Module) -> Iterator[List["SyncBatchNorm"]]:
    """Within the block, every :class:`SyncBatchNorm` of ``model`` normalises training batches with
    its local statistics (no collective), as plain BN does; restores after.

    Args:
        model: the model.

    Returns:
        A context manager yielding those layers.
    """
    layers = [m for m in model.modules() if isinstance(m, SyncBatchNorm)]
    saved = [(m, m.local_only) for m in layers]
    for m in layers:
        m.local_only = True
    try:
        yield layers
    finally:
        for m, flag in saved:
            m.local_only = flag
