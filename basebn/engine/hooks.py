"""Thin hooks on basecore's BaseHook. Each calls a plain function that also works without the trainer.

A hook gets its settings and shared objects (loaders, the run directory, the RunRecord) as constructor
arguments and reads only the trainer's live state (model, EMA, optimizer, progress, meter) at run time.
Each hook class has a ``priority``; ClsTrainer runs hooks in ascending priority, so the order of the list
given to it does not matter:

=========  ===================  ==========================================================
priority   hook                 why there
=========  ===================  ==========================================================
10         LRScheduleHook       before_iter: the lr is set before the step
20         EMAHook              after_iter: averages the weights the step produced
30         LoggerHook           after_iter: reads the trainer's meter only
40         PreciseBNHook        after_epoch: BN statistics before they are evaluated or saved
50         EvalHook             after_epoch: reports this epoch's metrics to the RunRecord
60         CheckpointHook       after_epoch: saves what precise BN and evaluation left
=========  ===================  ==========================================================
"""
import math
import time

import numpy as np
from basecore.engine import BaseHook
from loguru import logger

from .. import distributed as dist
from ..checkpoint import write_epoch_end, write_final
from ..layers.precise_bn import update_bn_stats
from ..utils.progress import ProgressDisplay
from .bn_hooks import BatchRenormHook, BNBufferSyncHook, FreezeBNHook, NonFiniteBNHook, freeze_start_epoch
from .ema import ema_should_update
from .evaluate import evaluate
from .lr_schedule import lr_at
from .metrics_log import append_metrics, metrics_path
from .tensorboard_hook import tensorboard_hooks
from .trainer import NonFiniteStateError
from .training_state import capture_training_state, nonfinite_arrays

__all__ = ["LRScheduleHook", "EMAHook", "LoggerHook", "PreciseBNHook", "EvalHook", "CheckpointHook",
           "default_hooks", "bn_training_hooks", "every_n_epochs"]


def every_n_epochs(epoch, max_epoch, n):
    """True after epoch `epoch` (1-based) for interval n; inf = never, -1 = only after the last; always at the end."""
    if epoch == max_epoch and n != math.inf:
        return True
    return n not in (math.inf, -1) and epoch % int(n) == 0


class LRScheduleHook(BaseHook):
    """Sets the lr of every param group before each iteration (per-iteration schedule with warm-up, from the
    `solver` config section: lr_schedule, warmup_*, lr_* keys, max_epoch)."""

    priority = 10

    def __init__(self, base_lr, solver):
        self.base_lr, self.solver = base_lr, solver

    def before_iter(self):
        t = self.trainer
        lr = lr_at(t.global_iter, t.iters_per_epoch, self.solver, self.base_lr)
        for group in t.optimizer.param_groups:
            group["lr"] = lr


class EMAHook(BaseHook):
    """Updates trainer.ema after each iteration: copies the model before `start_epoch` (0-based), then
    averages every `update_period` iterations (engine/ema.py's ema_should_update); an iteration whose optimizer
    step was skipped (non-finite gradients: trainer.step_skipped) leaves the EMA as it was."""

    priority = 20

    def __init__(self, start_epoch, update_period):
        self.start_epoch, self.update_period = start_epoch, update_period

    def after_iter(self):
        t = self.trainer
        if getattr(t, "step_skipped", False):
            return
        action = ema_should_update(t.global_iter, t.progress.epoch - 1, self.start_epoch, self.update_period)
        if action == "update":
            t.ema.update(t.model)
        elif action == "copy":
            t.ema.copy_from(t.model)


def log_interval(every_n_iter, iters_per_epoch):
    """Iterations between log lines: every_n_iter, but at least four lines per epoch (a short epoch is not silent
    until its end): min(every_n_iter, max(1, iters_per_epoch // 4))."""
    return max(1, min(int(every_n_iter), iters_per_epoch // 4))


class LoggerHook(BaseHook):
    """Logs iteration, loss, lr, batch top-1, data/step time, images/s and ETA every n iterations (log_interval);
    with `progress`, rank 0 also shows the epoch's iterations done (loss and lr beside them: utils/progress.py)."""

    priority = 30

    def __init__(self, every_n_iter, progress=False):
        self.requested = max(1, int(every_n_iter))
        self.every = self.requested
        self.window = []
        self.progress, self.bar = progress, None

    def before_epoch(self):
        t = self.trainer
        self.window = []
        self.every = log_interval(self.requested, t.iters_per_epoch)
        self.epoch_start = time.perf_counter()
        self.bar = ProgressDisplay(t.iters_per_epoch, f"epoch {t.progress.epoch}/{t.progress.max_epoch}", "iters",
                                   enabled=self.progress, rank=dist.get_rank())

    def after_epoch(self):
        if self.bar is not None:
            self.bar.close()

    def after_iter(self):
        t = self.trainer
        self.window.append(t.meter)
        if self.bar is not None:
            self.bar.update(1, postfix=f"loss {t.meter['loss']:.4f} lr {t.meter['lr']:.5f}")
        if t.progress.iter % self.every and t.progress.iter != t.iters_per_epoch:
            return
        w = self.window
        step = np.mean([m["data_time"] + m["step_time"] for m in w])
        images = sum(m["batch"] for m in w) * dist.get_world_size()
        seconds = sum(m["data_time"] + m["step_time"] for m in w)
        left = t.iters_per_epoch * t.progress.max_epoch - t.global_iter - 1
        logger.info(
            f"epoch {t.progress.epoch}/{t.progress.max_epoch} iter {t.progress.iter}/{t.iters_per_epoch} "
            f"loss {np.mean([m['loss'] for m in w]):.4f} lr {w[-1]['lr']:.5f} "
            f"top1 {np.mean([m['top1'] for m in w]):.2f} data {np.mean([m['data_time'] for m in w]):.3f}s "
            f"step {np.mean([m['step_time'] for m in w]):.3f}s {images / max(seconds, 1e-9):.0f} img/s "
            f"eta {_fmt_seconds(left * step)}"
        )
        self.window = []


def _fmt_seconds(s):
    s = int(s)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class PreciseBNHook(BaseHook):
    """Recomputes BN population statistics (model and EMA) before evaluation and checkpointing."""

    priority = 40

    def __init__(self, loader, every_n_epoch, num_samples, method, last_epoch=math.inf, progress=False):
        self.loader, self.every, self.num_samples, self.method = loader, every_n_epoch, num_samples, method
        self.last_epoch = last_epoch  # none after it (bn.freeze_last_epochs: the statistics stay frozen)
        self.progress = progress  # the pass's batches shown (rank 0)

    def after_epoch(self):
        t = self.trainer
        if self.every == math.inf or not every_n_epochs(t.progress.epoch, t.progress.max_epoch, self.every):
            return
        if t.progress.epoch > self.last_epoch:
            return
        self.loader.set_epoch(t.progress.epoch - 1)
        logger.info(f"precise BN ({self.method}) on {self.num_samples} samples after epoch {t.progress.epoch}")
        update_bn_stats(t.model, self.loader, self.num_samples, method=self.method, progress=self.progress)
        if t.ema is not None:  # averaged BN buffers are not population statistics of the averaged weights
            update_bn_stats(t.ema.module, self.loader, self.num_samples, method=self.method, progress=self.progress)


class EvalHook(BaseHook):
    """Evaluates model (and EMA) every n epochs and after the last; reports the metrics (None in an epoch
    without evaluation) to `record`; appends them to metrics.jsonl on rank 0 (fsynced)."""

    priority = 50

    def __init__(self, loader, every_n_epoch, run_dir, record, extra_metrics=None, progress=False):
        self.loader, self.every, self.path, self.record = loader, every_n_epoch, metrics_path(run_dir), record
        self.extra_metrics = extra_metrics  # () -> dict added to the row (NonFiniteBNHook.metrics)
        self.progress = progress  # batches done shown (rank 0)

    def after_epoch(self):
        t = self.trainer
        epoch = t.progress.epoch
        if epoch != t.progress.max_epoch and not every_n_epochs(epoch, t.progress.max_epoch, self.every):
            self.record.observe(epoch, None)  # the last epoch is always evaluated (eval_every_n_epoch=inf: only it)
            return
        if hasattr(self.loader, "set_epoch"):  # a data warning of this pass then names the epoch
            self.loader.set_epoch(epoch - 1)
        m = {"epoch": epoch, **evaluate(t.model, self.loader, desc=f"eval epoch {epoch}", progress=self.progress)}
        if t.ema is not None:
            e = evaluate(t.ema.module, self.loader, desc=f"eval EMA epoch {epoch}", progress=self.progress)
            m.update({f"ema_{k}": v for k, v in e.items() if k != "images"})
        if self.extra_metrics is not None:
            m.update(self.extra_metrics())
        self.record.observe(epoch, m)
        msg = (f"epoch {epoch} eval: top1 {m['top1']:.2f} top5 {m['top5']:.2f} loss {m['loss']:.4f} "
               f"({m['images']} images)")
        if "ema_top1" in m:
            msg += f" | EMA top1 {m['ema_top1']:.2f} top5 {m['ema_top5']:.2f}"
        logger.info(msg)
        if dist.is_main_process():
            append_metrics(self.path, m)


class CheckpointHook(BaseHook):
    """Epoch end: best.npz (`record` says this epoch is the best), epoch_N.npz (every n epochs), then
    latest.npz, the commit point (see checkpoint/run_files.py for why this order); final.npz after the last
    epoch. The payload is training_state's capture of the trainer (its RunRecord included). A payload whose
    model or EMA holds a NaN/inf is not written: NonFiniteStateError stops the run, the files before it kept."""

    priority = 60

    def __init__(self, run_dir, every_n_epoch, record):
        self.run_dir, self.every, self.record = run_dir, every_n_epoch, record

    def after_epoch(self):
        t = self.trainer
        if not dist.is_main_process():
            return
        epoch = t.progress.epoch
        keep = self.every != math.inf and epoch % int(self.every) == 0
        payload = _finite_payload(capture_training_state(t), f"the checkpoint of epoch {epoch}")
        write_epoch_end(self.run_dir, payload, best=self.record.is_best(epoch), keep_epoch=keep)

    def after_train(self):
        t = self.trainer
        if dist.is_main_process():
            payload = _finite_payload(capture_training_state(t, epoch=t.progress.max_epoch), "final.npz")
            path = write_final(self.run_dir, payload)
            logger.info(f"final weights: {path}")


def _finite_payload(payload, what):
    """`payload`, or NonFiniteStateError naming its first non-finite arrays (nothing is written)."""
    bad = nonfinite_arrays(payload)
    if bad:
        listed = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise NonFiniteStateError(f"{what} would hold NaN/inf values in {listed}; not written, training stopped.")
    return payload


def bn_training_hooks(cfg, precise_loader, progress=False):
    """(hooks, first frozen epoch or inf) of the bn.* training keys; hooks[0] is the NonFiniteBNHook. Their
    priorities (10-45, between the hooks above) are explained in engine/bn_hooks.py. `progress`: as default_hooks."""
    hooks = [NonFiniteBNHook()]
    if cfg.model.norm in ("BRN", "SyncBRN"):
        r = cfg.bn.renorm
        hooks.append(BatchRenormHook(r.r_max, r.d_max, r.warmup_epochs, r.ramp_epochs))
    if dist.get_world_size() > 1 and cfg.bn.sync_buffers != "off":
        hooks.append(BNBufferSyncHook(cfg.bn.sync_buffers))
    freeze_from = freeze_start_epoch(cfg.solver.max_epoch, cfg.bn.freeze_last_epochs)
    if freeze_from != math.inf:
        hooks.append(FreezeBNHook(freeze_from, precise_loader, cfg.bn.num_samples_precise, cfg.bn.precise_method,
                                  progress=progress))
    return hooks, freeze_from


def default_hooks(cfg, base_lr, run_dir, test_loader, precise_loader, record, progress=False):
    """The hooks cfg asks for (the one config -> hook switch): lr schedule, EMA (model_ema.enabled), logger,
    precise BN (when `precise_loader` is not None: engine/build.py's build_precise_bn_loader decides), eval
    and checkpoints reporting to `record`. Any order works: ClsTrainer orders hooks by priority. `progress`
    (basebn.train passes True): rank 0 shows the epoch's iterations, evaluation's and precise BN's batches."""
    hooks = [LRScheduleHook(base_lr, cfg.solver)]
    if cfg.model_ema.enabled:
        hooks.append(EMAHook(cfg.model_ema.start_epoch, cfg.model_ema.update_period))
    hooks.append(LoggerHook(cfg.log_every_n_iter, progress=progress))
    bn_hooks, freeze_from = bn_training_hooks(cfg, precise_loader, progress=progress)
    hooks.extend(bn_hooks)
    if precise_loader is not None:
        hooks.append(PreciseBNHook(precise_loader, cfg.bn.precise_every_n_epoch, cfg.bn.num_samples_precise,
                                   cfg.bn.precise_method, last_epoch=freeze_from - 1, progress=progress))
    hooks.append(EvalHook(test_loader, cfg.eval_every_n_epoch, run_dir, record, extra_metrics=bn_hooks[0].metrics,
                          progress=progress))
    if cfg.log.tensorboard:  # rank 0 only; a snapshot hook (38) and the writer (55): engine/tensorboard_hook.py
        hooks.extend(tensorboard_hooks(run_dir, cfg.log_every_n_iter, record, precise_bn=precise_loader is not None))
    hooks.append(CheckpointHook(run_dir, cfg.save_every_n_epoch, record))
    return hooks
