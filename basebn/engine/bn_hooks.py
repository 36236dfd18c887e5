"""Thin hooks for BN in training (docs/bn_training.md); each calls a function that works without the trainer.

=========  ======================  =================================================================
priority   hook                    why there
=========  ======================  =================================================================
10         BatchRenormHook         before_iter: r_max/d_max of this iteration before the step
35         BNBufferSyncHook        after_epoch: ranks agree on BN buffers before precise BN, eval, save
40         FreezeBNHook            before_epoch: precise BN, then BN on running statistics
45         NonFiniteBNHook         after_epoch: counts reported before EvalHook writes the metrics row
=========  ======================  =================================================================
"""
import math
from typing import Any, Optional, Union

from basecore.engine import BaseHook
from loguru import logger

from ..distributed import sync_bn_buffers
from ..layers.batch_renorm import renorm_limits_at, set_renorm_limits
from ..layers.bn_guard import take_nonfinite_counts
from ..layers.norm import set_norm_eval
from ..layers.precise_bn import update_bn_stats

__all__ = ["BatchRenormHook", "BNBufferSyncHook", "FreezeBNHook", "NonFiniteBNHook", "freeze_start_epoch"]


def freeze_start_epoch(max_epoch: int, freeze_last_epochs: int) -> Union[int, float]:
    """The first (1-based) epoch that trains with frozen BN statistics; inf when freezing is off (0).

    Args:
        max_epoch: epochs of the run.
        freeze_last_epochs: the last epochs to train with frozen statistics; 0: none.
    """
    return max_epoch - freeze_last_epochs + 1 if freeze_last_epochs > 0 else math.inf


class BatchRenormHook(BaseHook):
    """Sets every Batch Renormalization layer's r_max/d_max before each iteration (renorm_limits_at: plain BN
    during warm-up, then a linear ramp); a function of the global iteration, so a resumed run is exact.

    Args:
        r_max: the final r_max.
        d_max: the final d_max.
        warmup_epochs: epochs of plain BN.
        ramp_epochs: epochs of the linear ramp.
    """

    priority = 10

    def __init__(self, r_max: float, d_max: float, warmup_epochs: float, ramp_epochs: float):
        self.final, self.warmup_epochs, self.ramp_epochs = (r_max, d_max), warmup_epochs, ramp_epochs

    def before_iter(self):
        t = self.trainer
        limits = renorm_limits_at(t.global_iter, t.iters_per_epoch, *self.final, self.warmup_epochs,
                                  self.ramp_epochs)
        set_renorm_limits(t.model, *limits)


class BNBufferSyncHook(BaseHook):
    """After each epoch, makes the BN running statistics of the model (and EMA) equal on every rank
    (:func:`basebn.distributed.sync_bn_buffers`).

    Args:
        mode: "mean" or "broadcast".
    """

    priority = 35

    def __init__(self, mode: str):
        self.mode = mode

    def after_epoch(self):
        t = self.trainer
        sync_bn_buffers(t.model, self.mode)
        if t.ema is not None:
            sync_bn_buffers(t.ema.module, self.mode)


class FreezeBNHook(BaseHook):
    """From epoch `start_epoch` on, every BN layer runs on its running statistics (the norm_eval machinery;
    affine parameters keep training). At `start_epoch` itself, precise BN runs first when `precise_loader` is
    given. Decided per epoch from the epoch number, so a resumed run is exact.

    Args:
        start_epoch: the first (1-based) frozen epoch (freeze_start_epoch).
        precise_loader: the precise-BN loader, or None: no precise BN at start_epoch.
        num_samples: precise BN's samples.
        method: precise BN's method, ``"pooled"`` or ``"batch_average"``.
        progress: show precise BN's batches and summary line (rank 0).
    """

    priority = 40

    def __init__(self, start_epoch: Union[int, float], precise_loader: Optional[Any] = None,
                 num_samples: Optional[int] = 8192, method: str = "pooled", progress: bool = False):
        self.start, self.loader, self.num_samples, self.method = start_epoch, precise_loader, num_samples, method
        self.progress = progress

    def before_epoch(self):
        t = self.trainer
        epoch = t.progress.epoch
        if epoch < self.start:
            return
        if epoch == self.start:
            if self.loader is not None:
                self.loader.set_epoch(epoch - 1)
                logger.info(f"precise BN ({self.method}) before the BN statistics freeze at epoch {epoch}")
                update_bn_stats(t.model, self.loader, self.num_samples, method=self.method, progress=self.progress)
            logger.info(f"BN statistics frozen from epoch {epoch} to the end (affine parameters keep training)")
        set_norm_eval(t.model)


class NonFiniteBNHook(BaseHook):
    """After each epoch, logs the BN layers whose batch statistics were non-finite (their running statistics
    were left unchanged: bn_guard) and keeps the counts for the next metrics row (:meth:`metrics`)."""

    priority = 45

    def __init__(self):
        self.pending = {}

    def after_epoch(self):
        t = self.trainer
        counts = take_nonfinite_counts(t.model)
        if not counts:
            return
        for name, n in counts.items():
            self.pending[name] = self.pending.get(name, 0) + n
        listed = ", ".join(f"{name} ({n})" for name, n in counts.items())
        logger.warning(f"epoch {t.progress.epoch}: non-finite BN batch statistics, running statistics kept, in "
                       f"{len(counts)} layer(s): {listed}")

    def metrics(self):
        """``{"bn_nonfinite": {layer: batches}}`` since the last call, or {} when there were none."""
        out, self.pending = self.pending, {}
        return {"bn_nonfinite": out} if out else {}
