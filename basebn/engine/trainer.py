"""ClsTrainer: one training iteration (forward, backward, gradient all-reduce, clip, step).

Everything around the iteration (lr, EMA, logging, precise BN, evaluation, checkpoints) is a hook; hooks run
in ascending ``priority`` whatever order they are given in. Labels are int (B,) or soft targets (B, K)
(Mixup/CutMix). The trainer reads no config: engine/build.py's build_trainer turns the config into its
arguments.

An optimizer step never spans an epoch: the last one of an epoch takes the micro-batches left (fewer than
``accumulation_steps`` when they do not divide the epoch, each loss then divided by their number), so a checkpoint
holds no partial accumulation and ``--resume`` continues exactly. A step whose gradients hold a NaN or inf is
skipped, the AMP rule (:meth:`ClsTrainer._skip_step`); MAX_CONSECUTIVE_SKIPS skips in a row stop the run.
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
from ..layers.bn_guard import restore_running_stats, running_stats_layers, snapshot_running_stats
from ..layers.conv import fast_cpu_weight_grad
from ..layers.norm import set_norm_eval
from ..utils.interrupts import raise_pending
from .finite import all_finite
from .run_record import RunRecord

__all__ = ["ClsTrainer", "NonFiniteTrainingError", "NonFiniteLossError", "NonFiniteGradientError",
           "NonFiniteStateError", "MAX_CONSECUTIVE_SKIPS", "all_finite", "DEFAULT_HOOK_PRIORITY", "hook_priority"]

_DATA_WARN_AFTER = 5  # iterations measured before data time vs step time is judged
DEFAULT_HOOK_PRIORITY = 50
# optimizer steps in a row skipped for non-finite gradients before the run stops (a dynamic grad scaler's overflows
# count at a loss scale of 1 or less: above it an overflow is the scaler finding its scale)
MAX_CONSECUTIVE_SKIPS = 5


class NonFiniteTrainingError(FloatingPointError):
    """Training met a NaN/inf it cannot step past; the run stops (no checkpoint is written after it)."""


class NonFiniteLossError(NonFiniteTrainingError):
    """Loss became NaN/inf; the run stops before the optimizer step."""


class NonFiniteGradientError(NonFiniteTrainingError):
    """MAX_CONSECUTIVE_SKIPS optimizer steps in a row had NaN/inf gradients (each one skipped)."""


class NonFiniteStateError(NonFiniteTrainingError):
    """A checkpoint would hold NaN/inf model or EMA values; it is not written."""


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
    statistics move once per optimizer step, pooled over its micro-batches: layers/bn_accumulation.py),
    max_consecutive_skips (skipped steps in a row that stop the run: MAX_CONSECUTIVE_SKIPS).
    A skipped step (non-finite gradients, grad-scaler overflow) also rolls back that step's BN running-statistic
    updates. Attributes: those, meter (values of the last iteration for the logger), iters_per_epoch,
    step_skipped (this iteration's optimizer step was skipped: EMAHook leaves the EMA), skipped_steps (in the run).
    Checkpoints capture and restore the training state in engine/training_state.py.
    """

    def __init__(self, model, train_loader, optimizer, grad_manager, loss_fn, hooks=None, ema=None,
                 grad_scaler=None, record=None, amp=False, accumulation_steps=1, clip_grads=None, trace=False,
                 norm_eval=False, config=None, bn_accumulation_aware=True,
                 max_consecutive_skips=MAX_CONSECUTIVE_SKIPS):
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
        self._bn_layers = running_stats_layers(model)
        self._bn_snapshot = None  # BN buffers before this optimizer step's micro-batches (a skip restores them)
        self._divisors = {}  # micro-batches of a step -> the float32 tensor each loss is divided by
        self.max_consecutive_skips = int(max_consecutive_skips)
        self.step_skipped = False
        self.skipped_steps = 0
        self._skips = {"epoch": 0, "in_row": 0}
        if self.accum > self.iters_per_epoch:
            logger.warning(f"accumulation_steps={self.accum} is more than the {self.iters_per_epoch} iterations of "
                           f"an epoch: each optimizer step accumulates the {self.iters_per_epoch} micro-batches of "
                           f"its epoch (an optimizer step never spans epochs)")
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

        def forward_backward(images, labels, loss_scale, micro_batches):
            with self.grad_manager:
                with mge.amp.autocast(enabled=amp):
                    loss, logits = self._loss(images, labels)
                self.grad_manager.backward(loss / micro_batches, dy=loss_scale)
            return loss, logits

        if trace:
            fast_cpu_weight_grad(False)  # the numpy weight-gradient tap cannot be traced
            return jit_trace(forward_backward, symbolic=True)
        return forward_backward

    def _loss_scale(self):
        return mge.tensor(1.0 if self.grad_scaler is None else self.grad_scaler.scale_factor, dtype="float32")

    def _step_window(self):
        """(micro-batches of the optimizer step this iteration belongs to, whether this iteration ends it): steps
        of accumulation_steps from the epoch's start, the epoch's last step takes what is left."""
        start = (self.progress.iter - 1) // self.accum * self.accum  # iterations of the epoch before the step's
        size = min(self.accum, self.iters_per_epoch - start)
        return size, self.progress.iter - start == size

    def _divisor(self, micro_batches):
        t = self._divisors.get(micro_batches)
        if t is None:
            t = self._divisors[micro_batches] = mge.tensor(float(micro_batches), dtype="float32")
        return t

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
        micro_batches, ends_step = self._step_window()
        loss, logits = self._forward_backward(mge.tensor(images), mge.tensor(labels), self._loss_scale(),
                                              self._divisor(micro_batches))
        loss_value = self._sync_grads(loss)
        if not math.isfinite(loss_value):
            if self._bn_window is not None:
                self._bn_window.discard()
            raise NonFiniteLossError(
                f"loss is {loss_value} at epoch {self.progress.epoch} iteration {self.progress.iter} "
                f"(global iteration {self.global_iter}); stopped before the optimizer step. Lower "
                f"solver.basic_lr or set solver.grad_clip."
            )
        self.step_skipped = False
        if ends_step:
            self._optimizer_step()
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
        """At an optimizer step's first micro-batch: snapshot the BN buffers (handles, no copy), start pooling."""
        if self._bn_snapshot is None:
            self._bn_snapshot = snapshot_running_stats(self.model, self._bn_layers)
        if self._bn_window is not None and not self._bn_window.active:
            self._bn_window.start()

    def _optimizer_step(self):
        """Close the BN window, then step on finite gradients, or skip the step (:meth:`_skip_step`)."""
        if self._bn_window is not None and self._bn_window.active:
            self._bn_window.finish()
        snapshot, self._bn_snapshot = self._bn_snapshot, None
        reason, counts = self._nonfinite_gradients()
        if reason is not None:
            self._skip_step(snapshot, reason, counts)
            return
        self._skips["in_row"] = 0
        if self.clip_grads is not None:
            self.clip_grads(self.params)
        self.optimizer.step()
        self.optimizer.clear_grad()

    def _nonfinite_gradients(self):
        """(None, _) when the step's gradients are all finite, else (what was found, whether it counts towards
        max_consecutive_skips). Once per optimizer step, on the accumulated, all-reduced gradients (all ranks
        agree). A dynamic grad scaler checks them itself while unscaling (and drops them on overflow); otherwise
        :func:`all_finite` does."""
        scaler = self.grad_scaler
        if scaler is not None:
            scale = scaler.scale_factor  # every micro-step used it: it only changes here
            scaler.unscale(self.grad_manager.attached_tensors())
            overflow = bool(getattr(scaler, "_found_non_finite", False))
            checked = scaler.growth_interval != 0  # a fixed scale unscales without looking
            scaler.update()
            if checked:
                return (f"grad scaler overflow at loss scale {scale:g}", scale <= 1) if overflow else (None, False)
        if all_finite([p.grad for p in self.params if p.grad is not None]):
            return None, False
        return "non-finite gradients", True

    def _skip_step(self, snapshot, reason, counts=True):
        """The AMP rule: no optimizer step (weights and optimizer state unchanged), its gradients dropped, the BN
        running statistics of its micro-batches rolled back, and no EMA update (EMAHook reads step_skipped).
        The run's first skip is logged, later ones counted at each epoch end; max_consecutive_skips in a row that
        `counts` raise NonFiniteGradientError."""
        restore_running_stats(snapshot)
        self.optimizer.clear_grad()
        self.step_skipped = True
        self.skipped_steps += 1
        self._skips["epoch"] += 1
        self._skips["in_row"] += int(counts)
        p = self.progress
        where = f"epoch {p.epoch} iteration {p.iter} (global iteration {self.global_iter})"
        if self.skipped_steps == 1:
            logger.warning(f"optimizer step skipped at {where}, {reason}: weights, optimizer state, EMA and BN "
                           f"running statistics kept; further skips are counted at each epoch end")
        if self._skips["in_row"] >= self.max_consecutive_skips:
            raise NonFiniteGradientError(
                f"{self._skips['in_row']} optimizer steps in a row skipped ({reason}), the last at {where}; "
                f"stopped. Check the training data for NaN/inf values, or lower solver.basic_lr.")

    def after_epoch(self):
        """Report the epoch's skipped optimizer steps (if any), then run the hooks."""
        if self._skips["epoch"]:
            logger.warning(f"epoch {self.progress.epoch}: {self._skips['epoch']} optimizer step(s) skipped for "
                           f"non-finite gradients ({self.skipped_steps} in the run so far); weights, optimizer "
                           f"state, EMA and BN running statistics kept for each")
            self._skips["epoch"] = 0
        super().after_epoch()
