"""ClsTrainer: one training iteration (forward, backward, gradient all-reduce, clip, step).

Everything around the iteration (lr, EMA, logging, precise BN, evaluation, checkpoints) is a hook; hooks run
in ascending ``priority`` whatever order they are given in. Labels are int (B,) or soft targets (B, K)
(Mixup/CutMix). The trainer reads no config: engine/build.py's build_trainer turns the config into its
arguments.
"""
import math
import time

import megengine as mge
import megengine.functional as F
from basecore.engine import BaseTrainer
from loguru import logger
from megengine.jit import trace as jit_trace

from .. import distributed as dist
from ..layers.bn_accumulation import BNStatsAccumulator
from ..layers.bn_guard import restore_running_stats, snapshot_running_stats
from ..layers.conv import fast_cpu_weight_grad
from ..layers.norm import set_norm_eval
from ..utils.interrupts import raise_pending
from .run_record import RunRecord

__all__ = ["ClsTrainer", "NonFiniteLossError", "DEFAULT_HOOK_PRIORITY", "hook_priority"]

_DATA_WARN_AFTER = 5  # iterations measured before data time vs step time is judged
DEFAULT_HOOK_PRIORITY = 50


class NonFiniteLossError(FloatingPointError):
    """Loss became NaN/inf; the run stops before the optimizer step (no checkpoint is written after it)."""


def hook_priority(hook):
    """When `hook` runs among the trainer's hooks: its ``priority`` attribute (lower first), default 50."""
    return getattr(hook, "priority", DEFAULT_HOOK_PRIORITY)


class ClsTrainer(BaseTrainer):
    """Image-classification trainer.

    Arguments beyond BaseTrainer's: optimizer, grad_manager, loss_fn ``(logits, labels) -> loss``, ema
    (ModelEMA or None), grad_scaler (or None), record (the run's RunRecord; a fresh one by default), amp
    (autocast the forward), accumulation_steps, clip_grads (``params -> None`` or None), trace (jit-trace
    the step), norm_eval (BN layers stay in eval mode), config (the run's config: recorded in checkpoints
    and read by resume, never by the step), bn_accumulation_aware (with accumulation_steps > 1, BN running
    statistics move once per optimizer step, pooled over its micro-batches: layers/bn_accumulation.py).
    A step the grad scaler skips (overflow) also rolls back that step's BN running-statistic updates.
    Attributes: those, meter (values of the last iteration for the logger), iters_per_epoch.
    Checkpoints capture and restore the training state in engine/training_state.py.
    """

    def __init__(self, model, train_loader, optimizer, grad_manager, loss_fn, hooks=None, ema=None,
                 grad_scaler=None, record=None, amp=False, accumulation_steps=1, clip_grads=None, trace=False,
                 norm_eval=False, config=None, bn_accumulation_aware=True):
        super().__init__(model, train_loader, solver=None, hooks=hooks)
        self.cfg = config
        self.optimizer = optimizer
        self.grad_manager = grad_manager
        self.grad_scaler = grad_scaler
        self.ema = ema
        self.record = RunRecord() if record is None else record
        self.params = list(model.parameters())
        self.iters_per_epoch = len(train_loader)
        self.accum = int(accumulation_steps)
        self.clip_grads = clip_grads
        self.norm_eval = norm_eval
        self._bn_window = BNStatsAccumulator(model) if self.accum > 1 and bn_accumulation_aware else None
        self._bn_snapshot = None  # BN buffers before this optimizer step's micro-batches (grad scaler on)
        self.meter = {}
        self._epoch_iter = None
        self._loss_fn = loss_fn
        self._data_vs_step = [0.0, 0.0, 0]  # data and step seconds summed over measured iterations
        self._forward_backward = self._build_step(amp, trace)

    def register_hooks(self, hooks):
        """Add `hooks` (None entries dropped); all hooks then run in ascending :func:`hook_priority`, ties in
        the order given, so the order of the list carries no meaning beyond ties."""
        super().register_hooks(hooks)
        self._hooks.sort(key=hook_priority)

    # -- the step -------------------------------------------------------------------------------
    def _loss(self, images, labels):
        logits = self.model(images)
        return self._loss_fn(logits, labels), logits

    def _build_step(self, amp, trace):
        """forward + backward; the loss scale is an input (dy), so a traced step never bakes it in."""

        def forward_backward(images, labels, loss_scale):
            with self.grad_manager:
                with mge.amp.autocast(enabled=amp):
                    loss, logits = self._loss(images, labels)
                self.grad_manager.backward(loss / self.accum, dy=loss_scale)
            return loss, logits

        if trace:
            fast_cpu_weight_grad(False)  # the numpy weight-gradient tap cannot be traced
            return jit_trace(forward_backward, symbolic=True)
        return forward_backward

    def _loss_scale(self):
        return mge.tensor(1.0 if self.grad_scaler is None else self.grad_scaler.scale_factor, dtype="float32")

    @property
    def global_iter(self):
        """0-based index of the current iteration over the whole run."""
        p = self.progress
        return (p.epoch - 1) * self.iters_per_epoch + p.iter - 1

    def before_epoch(self):
        self.model.train()
        if self.norm_eval:
            set_norm_eval(self.model)
        self.dataloader.set_epoch(self.progress.epoch - 1)
        self._epoch_iter = iter(self.dataloader)
        super().before_epoch()

    def train_one_iter(self):
        raise_pending()  # a Ctrl-C / SIGTERM whose exception a finalizer swallowed (basebn.utils.interrupts)
        t0 = time.perf_counter()
        images, labels = next(self._epoch_iter)
        t1 = time.perf_counter()
        self._open_bn_window()
        loss, logits = self._forward_backward(mge.tensor(images), mge.tensor(labels), self._loss_scale())
        loss_value = self._sync_grads(loss)
        if not math.isfinite(loss_value):
            if self._bn_window is not None:
                self._bn_window.discard()
            raise NonFiniteLossError(
                f"loss is {loss_value} at epoch {self.progress.epoch} iteration {self.progress.iter} "
                f"(global iteration {self.global_iter}); stopped before the optimizer step. Lower "
                f"solver.basic_lr or set solver.grad_clip."
            )
        if (self.global_iter + 1) % self.accum == 0:
            self._optimizer_step()
        elif self.progress.iter == self.iters_per_epoch:  # the epoch's hooks (precise BN, eval, save) see it all
            self._bn_snapshot = None
            if self._bn_window is not None:
                self._bn_window.finish()
        hard = labels.argmax(axis=1) if labels.ndim == 2 else labels  # soft targets: their top class
        top1 = float((logits.numpy().argmax(axis=1) == hard).mean() * 100)
        t2 = time.perf_counter()
        self.meter = {"loss": loss_value, "top1": top1, "data_time": t1 - t0, "step_time": t2 - t1,
                      "batch": len(labels), "lr": self.optimizer.param_groups[0]["lr"]}
        self._watch_data_time(t1 - t0, t2 - t1)

    def _watch_data_time(self, data_time, step_time):
        """Warn once when waiting for data takes longer than the step (first iteration of an epoch,
        which starts the loader, not counted; decided over at least _DATA_WARN_AFTER iterations)."""
        acc = self._data_vs_step
        if acc is None or self.progress.iter == 1:
            return
        acc[0] += data_time
        acc[1] += step_time
        acc[2] += 1
        if acc[2] >= _DATA_WARN_AFTER and acc[0] > acc[1]:
            self._data_vs_step = None
            workers = getattr(self.dataloader, "num_workers", 0)
            logger.warning(
                f"data loading is slower than the training step ({acc[0] / acc[2]:.3f}s waiting for data vs "
                f"{acc[1] / acc[2]:.3f}s per step): raise data.num_workers (now {workers}) if CPUs are free, "
                f"and measure the loader alone with python -m basebn.tools.data_speed CONFIG")

    def _sync_grads(self, loss):
        """All-reduce (average) gradients in one packed collective; returns the mean loss over ranks.

        The loss rides in the same buffer, so a NaN on any rank stops every rank together.
        """
        world = dist.get_world_size()
        if world == 1:
            return float(loss.item())
        grads = [p.grad if p.grad is not None else F.zeros(p.shape) for p in self.params]
        flat = F.concat([g.reshape(-1) for g in grads] + [loss.reshape(1).detach()])
        flat = dist.all_reduce_sum(flat) / world
        offset = 0
        for p, g in zip(self.params, grads):
            if p.grad is not None:
                p.grad = flat[offset:offset + g.size].reshape(g.shape)
            offset += g.size
        return float(flat[-1].item())

    def _open_bn_window(self):
        """At an optimizer step's first micro-batch: snapshot BN buffers (grad scaler on), start pooling."""
        if self.grad_scaler is not None and self._bn_snapshot is None:
            self._bn_snapshot = snapshot_running_stats(self.model)
        if self._bn_window is not None and not self._bn_window.active:
            self._bn_window.start()

    def _optimizer_step(self):
        if self._bn_window is not None and self._bn_window.active:
            self._bn_window.finish()
        snapshot, self._bn_snapshot = self._bn_snapshot, None
        if self.grad_scaler is not None:
            # once per optimizer step, on the accumulated, all-reduced gradients: every micro-step used the
            # same scale (it only changes here), and all ranks see the same gradients, so they agree on overflow
            self.grad_scaler.unscale(self.grad_manager.attached_tensors())
            if getattr(self.grad_scaler, "_found_non_finite", False) and snapshot is not None:
                restore_running_stats(snapshot)  # the skipped step leaves no trace in the BN buffers either
                logger.warning(f"grad scaler skipped the step at global iteration {self.global_iter} (overflow): "
                               f"BN running statistics rolled back")
            self.grad_scaler.update()
        if self.clip_grads is not None:
            self.clip_grads(self.params)
        self.optimizer.step()
        self.optimizer.clear_grad()
