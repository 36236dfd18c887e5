"""Precise BN: replace BN running statistics by population statistics of each layer's input.

`update_bn_stats(model, loader, num_samples)` runs the model in train mode (features as during
training) with all weights frozen, records each BN layer's input per batch, and writes

    running_mean = mean over every sample seen
    running_var  = unbiased variance over every sample seen
                 = (sum_b M2_b + sum_b n_b (mean_b - mean)^2) / (N - 1)

i.e. the per-batch variances plus the variance of the per-batch means (Chan's parallel combine).
pycls/basecls/mmpretrain average per-batch variances and so miss the between-batch term; that
behaviour is kept as method="batch_average" for comparison. Ranks combine exactly, weighted by count.
"""
import math

import numpy as np

import megengine as mge
import megengine.module as M
from loguru import logger

from .. import dist
from .progress import progress_bar

__all__ = ["update_bn_stats", "collect_bn_population_stats", "bn_layers"]

_SKIPPED = (M.GroupNorm, M.InstanceNorm, M.LayerNorm)


def _bn_types():
    from ..layers.sync_bn import SyncBatchNorm

    return (M.BatchNorm1d, M.BatchNorm2d, SyncBatchNorm)


def bn_layers(model):
    """(name, module) of every BN layer with running statistics to recompute (FrozenBN excluded)."""
    from ..layers.frozen_bn import FrozenBatchNorm2d

    return [(n, m) for n, m in model.named_modules()
            if isinstance(m, _bn_types()) and not isinstance(m, FrozenBatchNorm2d)
            and getattr(m, "track_running_stats", True) and getattr(m, "running_mean", None) is not None]


class _LayerStats:
    """Per-channel running count/mean/M2 (float64, Chan's combine) and per-batch sums for batch_average."""

    def __init__(self):
        self.count, self.mean, self.m2 = 0.0, 0.0, 0.0
        self.batches, self.sum_batch_mean, self.sum_batch_var = 0, 0.0, 0.0

    def add(self, x):
        c = x.shape[1]
        flat = np.moveaxis(x, 1, 0).reshape(c, -1).astype(np.float64)
        n = flat.shape[1]
        if n == 0:
            return
        mean_b = flat.mean(axis=1)
        m2_b = ((flat - mean_b[:, None]) ** 2).sum(axis=1)
        self.count, self.mean, self.m2 = _chan(self.count, self.mean, self.m2, n, mean_b, m2_b)
        self.batches += 1
        self.sum_batch_mean = self.sum_batch_mean + mean_b
        self.sum_batch_var = self.sum_batch_var + m2_b / max(n - 1, 1)


def _chan(na, ma, m2a, nb, mb, m2b):
    n = na + nb
    delta = mb - ma
    return n, ma + delta * (nb / n), m2a + m2b + delta ** 2 * (na * nb / n)


def _images(batch):
    x = batch[0] if isinstance(batch, (tuple, list)) else batch
    return x.numpy() if isinstance(x, mge.Tensor) else np.asarray(x, dtype=np.float32)


def _rank_quota(num_samples):
    world, rank = dist.get_world_size(), dist.get_rank()
    return num_samples // world + (1 if rank < num_samples % world else 0)


def _run_pass(model, layers, loader, num_samples):
    """Forward up to this rank's quota of samples in train mode, recording each BN layer's input."""
    stats = {name: _LayerStats() for name, _ in layers}
    handles = [m.register_forward_pre_hook(_recorder(stats[name])) for name, m in layers]
    # SyncBN layers exchange statistics in every train-mode forward: keep ranks in lockstep, a rank
    # without data forwarding an empty batch (SyncBN supports ranks with zero samples).
    from ..layers.sync_bn import SyncBatchNorm

    lockstep = dist.get_world_size() > 1 and any(isinstance(m, SyncBatchNorm) for _, m in layers)
    quota, seen = _rank_quota(num_samples), 0
    it, shape = iter(loader), None
    bar = progress_bar(range(math.ceil(num_samples / max(getattr(loader, "batch_size", 1), 1)) or 1),
                       desc="precise BN")
    try:
        while True:
            x = None
            if seen < quota:
                batch = next(it, None)
                if batch is not None:
                    x = _images(batch)[: quota - seen]
                    shape = x.shape
            if lockstep:
                shapes = [s for s in dist.all_gather_object(None if x is None else x.shape) if s is not None]
                if not shapes:
                    break
                if x is None:
                    x = np.zeros((0, *shapes[0][1:]), dtype=np.float32)
            elif x is None:
                break
            if len(x):
                seen += len(x)
            model(mge.tensor(x))
            if hasattr(bar, "update"):
                bar.update(1)
    finally:
        for h in handles:
            h.remove()
        if hasattr(bar, "close"):
            bar.close()
    return stats, seen


def _recorder(layer_stats):
    def hook(module, inputs):
        layer_stats.add(inputs[0].numpy())

    return hook


def _combine_across_ranks(names, stats):
    """Exact cross-rank combine: gather each rank's (count, mean, M2, batch sums) and merge in order."""
    local = {n: (stats[n].count, stats[n].mean, stats[n].m2, stats[n].batches, stats[n].sum_batch_mean,
                 stats[n].sum_batch_var) for n in names}
    if dist.get_world_size() == 1:
        return local
    merged = {}
    gathered = dist.all_gather_object(local)
    for n in names:
        acc = (0.0, 0.0, 0.0, 0, 0.0, 0.0)
        for rank_stats in gathered:
            c, m, m2, b, sbm, sbv = rank_stats[n]
            if c == 0:
                continue
            cnt, mean, mm2 = _chan(acc[0], acc[1], acc[2], c, m, m2) if acc[0] else (c, m, m2)
            acc = (cnt, mean, mm2, acc[3] + b, acc[4] + sbm, acc[5] + sbv)
        merged[n] = acc
    return merged


def collect_bn_population_stats(model, loader, num_samples=8192, method="pooled"):
    """{layer name: (count, mean, var)} of every BN layer's input, computed as in update_bn_stats.

    Nothing in the model is changed. `var` is unbiased (pooled) or the mean of per-batch unbiased
    variances (batch_average). Layers that saw no sample are left out.
    """
    return _collect(model, loader, num_samples, method)[0]


def _collect(model, loader, num_samples, method):
    if method not in ("pooled", "batch_average"):
        raise ValueError(f"precise BN method must be 'pooled' or 'batch_average', got {method!r}")
    layers = bn_layers(model)
    skipped = [n for n, m in model.named_modules() if isinstance(m, _SKIPPED)]
    if skipped:
        logger.info(f"precise BN skips {len(skipped)} GroupNorm/InstanceNorm/LayerNorm layer(s): no running stats")
    if not layers:
        return {}, 0
    modes = [(m, m.training) for m in model.modules()]
    saved = {n: (np.asarray(m.running_mean).copy(), np.asarray(m.running_var).copy()) for n, m in layers}
    model.train()
    try:
        stats, seen = _run_pass(model, layers, loader, num_samples)
    finally:
        for m, training in modes:
            m.training = training
        for n, m in layers:  # the train-mode forwards moved the running stats: put them back
            m.running_mean._reset(mge.tensor(saved[n][0]))
            m.running_var._reset(mge.tensor(saved[n][1]))
    merged = _combine_across_ranks([n for n, _ in layers], stats)
    out = {}
    for n, (count, mean, m2, batches, sum_bm, sum_bv) in merged.items():
        if count == 0:
            continue
        if method == "pooled":
            out[n] = (count, np.asarray(mean), np.asarray(m2) / max(count - 1, 1))
        else:
            out[n] = (count, np.asarray(sum_bm) / batches, np.asarray(sum_bv) / batches)
    return out, int(dist.all_reduce_sum(np.array([seen], dtype=np.int64))[0])


def update_bn_stats(model, loader, num_samples=8192, *, method="pooled", progress=True):
    """Recompute every BN layer's running statistics over up to `num_samples` samples (across ranks).

    `loader` yields (images, labels) pairs or bare images, numpy arrays or tensors, of any batch sizes.
    Weights, momentum and train/eval flags are untouched. With no data at all the statistics stay as
    they were and a warning says so. Returns {'samples': N, 'layers': K}.
    """
    stats, samples = _collect(model, loader, num_samples, method)
    if not stats:
        logger.warning("precise BN saw no samples (empty loader?): BN statistics left unchanged")
        return {"samples": 0, "layers": 0}
    for name, m in bn_layers(model):
        if name in stats:
            _, mean, var = stats[name]
            m.running_mean._reset(mge.tensor(mean.reshape(m.running_mean.shape).astype(np.float32)))
            m.running_var._reset(mge.tensor(var.reshape(m.running_var.shape).astype(np.float32)))
    logger.info(f"precise BN ({method}): {len(stats)} layer(s) from {samples} samples")
    return {"samples": samples, "layers": len(stats)}
