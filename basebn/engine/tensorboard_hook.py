"""Thin hooks feeding :class:`~basebn.engine.tensorboard_log.TensorBoardLog` (rank 0 only).

Two hooks around the hook order of engine/hooks.py: :class:`RunningStatsSnapshotHook` (priority 38: after the
ranks' BN buffer sync at 35, before precise BN at 40) keeps the BN running statistics, and
:class:`TensorBoardHook` (priority 55: after evaluation at 50, before the checkpoint at 60) writes the logged
iterations, the evaluation the RunRecord received and, when precise BN rewrote the statistics in between, the
drift per layer (no schedule is repeated here: statistics that did not change mean no pass ran). The writer
opens at before_train at the trainer's first step, so a resumed run supersedes what the killed one logged
after its checkpoint.
"""
import numpy as np
from basecore.engine import BaseHook

from .. import distributed as dist
from .tensorboard_log import TensorBoardLog, precise_bn_drift, running_stats

__all__ = ["RunningStatsSnapshotHook", "TensorBoardHook", "tensorboard_hooks"]


class RunningStatsSnapshotHook(BaseHook):
    """After each epoch, before precise BN, keeps the running statistics of the model and the EMA
    (``before``: {"model": ..., "ema": ... or None})."""

    priority = 38

    def __init__(self):
        self.before = None

    def after_epoch(self):
        t = self.trainer
        self.before = {"model": running_stats(t.model), "ema": None if t.ema is None else running_stats(t.ema.module)}


class TensorBoardHook(BaseHook):
    """Writes TensorBoard events into `log_dir`: every `every_n_iter` iterations (and an epoch's last) the
    window means of loss, lr, batch top-1, data and step time and images/s over `world_size` processes;
    after each epoch the evaluation `record` received and the precise-BN drift `snapshot` allows."""

    priority = 55

    def __init__(self, log_dir, every_n_iter, world_size, record, snapshot=None):
        self.log_dir, self.every, self.world = log_dir, max(1, int(every_n_iter)), world_size
        self.record, self.snapshot = record, snapshot
        self.log, self.window = None, []

    def before_train(self):
        self.log = TensorBoardLog(self.log_dir, first_step=self.trainer.global_iter + 1)

    def before_epoch(self):
        self.window = []

    def after_iter(self):
        t = self.trainer
        self.window.append(t.meter)
        if t.progress.iter % self.every and t.progress.iter != t.iters_per_epoch:
            return
        w, self.window = self.window, []
        seconds = sum(m["data_time"] + m["step_time"] for m in w)
        self.log.iteration(t.global_iter + 1, loss=np.mean([m["loss"] for m in w]), lr=w[-1]["lr"],
                           top1=np.mean([m["top1"] for m in w]), data_time=np.mean([m["data_time"] for m in w]),
                           step_time=np.mean([m["step_time"] for m in w]),
                           images_per_s=sum(m["batch"] for m in w) * self.world / max(seconds, 1e-9))

    def after_epoch(self):
        t = self.trainer
        step = t.progress.epoch * t.iters_per_epoch
        if self.record.last_metrics is not None:
            self.log.evaluation(step, self.record.last_metrics)
        before = self.snapshot.before if self.snapshot is not None else None
        if before is not None:
            self._drift(step, before["model"], running_stats(t.model), "bn_drift")
            if before["ema"] is not None and t.ema is not None:
                self._drift(step, before["ema"], running_stats(t.ema.module), "bn_drift_ema")
        self.log.flush()

    def _drift(self, step, before, after, section):
        if any(not np.array_equal(before[k], after[k]) for k in after):  # precise BN rewrote them
            self.log.bn_drift(step, precise_bn_drift(before, after), section)

    def after_train(self):
        self.log.close()


def tensorboard_hooks(log_dir, every_n_iter, record, precise_bn=False):
    """The hooks writing the run's TensorBoard events into `log_dir` (none on ranks other than 0); with
    `precise_bn` (the run has a precise-BN loader) also the drift of each precise-BN pass."""
    if not dist.is_main_process():
        return []
    snapshot = RunningStatsSnapshotHook() if precise_bn else None
    hook = TensorBoardHook(log_dir, every_n_iter, dist.get_world_size(), record, snapshot)
    return [h for h in (snapshot, hook) if h is not None]
