"""A run's TensorBoard event files (tensorboardX): training curves, evaluations, precise-BN drift per layer.

Steps are iterations done: an iteration's numbers at the step it ends, an epoch's evaluation and precise-BN
drift at the epoch's last step, so every curve shares one x axis. Each writer opens a new event file whose
first events are a SessionLog START at the first step it will write (what tensorboardX's ``purge_step``
writes): TensorBoard's reader then drops what an earlier writer (a killed run) logged from that step on, so a
step logged before a kill and again after the resume appears once. TensorBoard reads a directory's event files
in name order; the name's timestamp has one-second resolution, so a sequence suffix keeps same-second files in
the order they were opened. Events are written synchronously (tensorboardX's ``EventsWriter``; its
``SummaryWriter`` queues them for a thread that ``flush()`` does not wait for): after
:meth:`TensorBoardLog.flush` everything logged is on disk.
"""
import glob
import os
import time

import numpy as np
from tensorboardX.event_file_writer import EventsWriter
from tensorboardX.proto.event_pb2 import Event, SessionLog
from tensorboardX.summary import histogram, scalar

from .bn_report import ema_drift

__all__ = ["TensorBoardLog", "EVENT_GLOB", "running_stats", "precise_bn_drift"]

EVENT_GLOB = "events.out.tfevents.*"


def _exponential_bins():
    """TensorBoard's standard histogram buckets (tensorboardX's ``default_bins``): +-1e-12 .. 1e20, x1.1 apart,
    and 0 (fixed edges, as the standard writer used)."""
    edges, v = [], 1e-12
    while v < 1e20:
        edges.append(v)
        v *= 1.1
    return [-e for e in reversed(edges)] + [0.0] + edges


_HISTOGRAM_BINS = _exponential_bins()


def running_stats(module):
    """{NAME.running_mean / NAME.running_var: float64 copy} of `module`'s BN layers (what precise BN rewrites)."""
    return {k: np.array(v, dtype=np.float64) for k, v in module.state_dict().items()
            if k.endswith((".running_mean", ".running_var"))}


def precise_bn_drift(before, after):
    """{layer: {"mean_shift", "var_ratio"}}: running statistics `before` a precise-BN pass against those it
    wrote (`after`, the population statistics), both :func:`running_stats` dicts; the BN report's drift
    numbers (:func:`~basebn.engine.bn_report.ema_drift` with the recomputed statistics as the reference)."""
    return {name: {k: row[k] for k in ("mean_shift", "var_ratio")} for name, row in ema_drift(before, after).items()}


class TensorBoardLog:
    """One writer's event file in `log_dir`; `first_step` is the first step it will write (earlier writers'
    events from that step on are superseded). Tags: ``train/*`` and ``time/*`` per logged iteration,
    ``eval/*`` (``eval_ema/*``) per evaluation, ``bn_drift/LAYER/*`` (``bn_drift_ema/...``) per precise-BN pass
    with ``bn_drift/mean_shift`` / ``var_ratio`` histograms over the layers."""

    def __init__(self, log_dir, first_step=1):
        os.makedirs(log_dir, exist_ok=True)
        sequence = len(glob.glob(os.path.join(log_dir, EVENT_GLOB)))
        self.writer = EventsWriter(os.path.join(log_dir, "events"), filename_suffix=f".{sequence:04d}")
        self._write(Event(step=int(first_step), session_log=SessionLog(status=SessionLog.START)))

    def _write(self, event):
        event.wall_time = time.time()
        self.writer.write_event(event)

    def _summary(self, summary, step):
        self._write(Event(summary=summary, step=int(step)))

    def iteration(self, step, loss, lr, top1, data_time, step_time, images_per_s):
        """The numbers of a logged iteration (window means, as the log line)."""
        for tag, value in (("train/loss", loss), ("train/lr", lr), ("train/top1", top1), ("time/data_s", data_time),
                           ("time/step_s", step_time), ("time/images_per_s", images_per_s)):
            self._summary(scalar(tag, float(value)), step)

    def evaluation(self, step, metrics):
        """An evaluation's top1 / top5 / loss (``eval/*``) and its EMA's (``ema_*`` keys -> ``eval_ema/*``)."""
        for key in ("top1", "top5", "loss"):
            for prefix, section in (("", "eval"), ("ema_", "eval_ema")):
                if metrics.get(prefix + key) is not None:
                    self._summary(scalar(f"{section}/{key}", float(metrics[prefix + key])), step)

    def bn_drift(self, step, drift, section="bn_drift"):
        """Per-layer drift rows (:func:`precise_bn_drift`) as scalars ``SECTION/LAYER/{mean_shift,var_ratio}``
        and as histograms over the layers ``SECTION/{mean_shift,var_ratio}`` (finite values only: a channel whose
        recomputed variance is 0 makes its layer's var_ratio infinite)."""
        for name, row in drift.items():
            for key, value in row.items():
                self._summary(scalar(f"{section}/{name}/{key}", float(value)), step)
        for key in ("mean_shift", "var_ratio"):
            values = np.array([row[key] for row in drift.values()], dtype=np.float64)
            values = values[np.isfinite(values)]  # (the layer's scalar keeps an inf / nan)
            if values.size:
                self._summary(histogram(f"{section}/{key}", values, _HISTOGRAM_BINS), step)

    def flush(self):
        """Write everything logged so far to the file."""
        self.writer.flush()

    def close(self):
        """Flush and close the event file."""
        self.writer.close()
