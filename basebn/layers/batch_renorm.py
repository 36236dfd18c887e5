"""Batch Renormalization (Ioffe 2017): BatchRenorm2d, its synchronised variant, and the r_max/d_max schedule.

Training: ``r = clip(sigma_B / sigma, 1/r_max, r_max)``, ``d = clip((mu_B - running_mean) / sigma, -d_max,
d_max)`` with ``sigma_B = sqrt(biased var_B + eps)``, ``sigma = sqrt(running_var + eps)``; ``y = w * (r * xhat
+ d) + b`` with r and d constants of the gradient, computed by the BN ops with r, d folded into the per-channel
scale and shift (:func:`.bn_function.kernel_bn_forward`). Running statistics move exactly as BatchNorm2d's;
eval is BatchNorm2d's. ``r_max``/``d_max`` are plain attributes (not saved): the state dict is BatchNorm2d's,
so weights move between BN and BRN freely. ``r_max=1, d_max=0`` is plain BN.
"""
from typing import Any, Optional, Tuple

import megengine.module as M
from megengine.jit import tracing

from .batch_norm import BatchNorm2d
from .bn_function import kernel_bn_forward
from .sync_bn import SyncBatchNorm

__all__ = ["BatchRenorm2d", "SyncBatchRenorm", "check_renorm_limits", "set_renorm_limits", "renorm_limits_at"]


def check_renorm_limits(r_max: float, d_max: float) -> Tuple[float, float]:
    """(r_max, d_max) as floats.

    Args:
        r_max: the largest ratio of batch to running standard deviation, >= 1.
        d_max: the largest shift of the batch mean in running standard deviations, >= 0.

    Raises:
        ValueError: r_max < 1 or d_max < 0, naming the value.
    """
    if not float(r_max) >= 1.0:
        raise ValueError(f"r_max must be >= 1, got {r_max!r}")
    if not float(d_max) >= 0.0:
        raise ValueError(f"d_max must be >= 0, got {d_max!r}")
    return float(r_max), float(d_max)


class BatchRenorm2d(BatchNorm2d):
    """Batch Renormalization over (N, C, H, W) input, one process; BatchNorm2d's arguments plus r_max, d_max.

    Args:
        num_features: C.
        eps: added to the variance.
        momentum: weight of the old running value (MegEngine's convention).
        affine: learnable weight and bias.
        r_max: the largest ratio of batch to running standard deviation (1: plain BN).
        d_max: the largest shift of the batch mean, in running standard deviations (0: plain BN).
        **kwargs: to BatchNorm2d, but not norm_batch_size.

    Raises:
        ValueError: a norm_batch_size, r_max < 1 or d_max < 0.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: Optional[float] = 0.9, affine: bool = True,
                 r_max: float = 3.0, d_max: float = 5.0, **kwargs: Any):
        super().__init__(num_features, eps=eps, momentum=momentum, affine=affine, **kwargs)
        if self.norm_batch_size is not None:
            raise ValueError("BatchRenorm2d takes no norm_batch_size (ghost groups are plain BN's)")
        self.r_max, self.d_max = check_renorm_limits(r_max, d_max)

    def forward(self, inp):
        if tracing.is_tracing() and self.training:
            raise ValueError("BatchRenorm2d cannot run under jit.trace in training (turn trace off)")
        if tracing.is_tracing():
            return super().forward(inp)
        self._check_input_ndim(inp)
        return kernel_bn_forward(self, inp, renorm=(self.r_max, self.d_max))

    def _module_info_string(self):
        return f"{super()._module_info_string()}, r_max={self.r_max}, d_max={self.d_max}"


class SyncBatchRenorm(SyncBatchNorm):
    """Batch Renormalization with the batch statistics of all ranks (SyncBatchNorm's arguments plus r_max, d_max).

    Args:
        num_features: C.
        eps: added to the variance.
        momentum: weight of the old running value (MegEngine's convention).
        affine: learnable weight and bias.
        r_max: the largest ratio of batch to running standard deviation (1: plain BN).
        d_max: the largest shift of the batch mean, in running standard deviations (0: plain BN).
        **kwargs: to SyncBatchNorm (group, ...).

    Raises:
        ValueError: r_max < 1 or d_max < 0.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: Optional[float] = 0.9, affine: bool = True,
                 r_max: float = 3.0, d_max: float = 5.0, **kwargs: Any):
        super().__init__(num_features, eps=eps, momentum=momentum, affine=affine, **kwargs)
        self.r_max, self.d_max = check_renorm_limits(r_max, d_max)

    def forward(self, inp):
        self._check_input_ndim(inp)
        return kernel_bn_forward(self, inp, sync=self.training and not self.local_only, group=self.group,
                                 renorm=(self.r_max, self.d_max))

    def _module_info_string(self):
        return f"{super()._module_info_string()}, r_max={self.r_max}, d_max={self.d_max}"


def set_renorm_limits(model: M.Module, r_max: float, d_max: float) -> int:
    """Set r_max and d_max of every Batch Renormalization layer of `model`.

    Args:
        model: the model.
        r_max: as BatchRenorm2d takes it.
        d_max: likewise.

    Returns:
        How many layers there are.

    Raises:
        ValueError: r_max < 1 or d_max < 0.
    """
    r_max, d_max = check_renorm_limits(r_max, d_max)
    layers = [m for m in model.modules() if isinstance(m, (BatchRenorm2d, SyncBatchRenorm))]
    for m in layers:
        m.r_max, m.d_max = r_max, d_max
    return len(layers)


def renorm_limits_at(global_iter: int, iters_per_epoch: int, r_max: float, d_max: float, warmup_epochs: float,
                     ramp_epochs: float) -> Tuple[float, float]:
    """(r_max, d_max) at 0-based iteration `global_iter`: plain BN (1, 0) for `warmup_epochs`, then linear
    per iteration to the final (r_max, d_max) over `ramp_epochs`, then the final values.

    Args:
        global_iter: the iteration, 0-based over the whole run.
        iters_per_epoch: iterations per epoch.
        r_max: the final r_max.
        d_max: the final d_max.
        warmup_epochs: epochs of plain BN.
        ramp_epochs: epochs of the linear ramp.
    """
    warm = warmup_epochs * iters_per_epoch
    ramp = ramp_epochs * iters_per_epoch
    if global_iter < warm:
        return 1.0, 0.0
    frac = 1.0 if ramp <= 0 else min(1.0, (global_iter - warm) / ramp)
    return 1.0 + (r_max - 1.0) * frac, d_max * frac
