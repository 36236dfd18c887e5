"""Precise BN: recompute BN running statistics as population statistics of the frozen model.

The model runs in train mode over up to ``num_samples`` samples (across ranks); each BN layer's
input moments come from :func:`bn_ops.bn_stats` and are merged over batches, then ranks, with
:mod:`.moments` (one ``all_gather``), so every rank writes identical statistics. ``"pooled"``
(default) is the population variance; ``"batch_average"`` is pycls's average of batch variances.
Design notes (methods, rank quotas, SyncBN modes): docs/bn_design.md.
"""
import contextlib
import math
import time
from typing import Any, Dict, Iterable, List, Optional, Tuple

import numpy as np
from loguru import logger

import megengine as mge
import megengine.functional as F
import megengine.module as M

from .. import distributed as dist
from ..utils.progress import ProgressDisplay
from ..ops import bn_ops
from .moments import Moments, empty_moments, merge_moments
from .norm import OTHER_NORM_TYPES, has_running_stats, is_bn, is_frozen_bn, is_sync_bn
from .sync_bn import local_statistics

__all__ = ["update_bn_stats", "collect_bn_population_stats", "bn_layers_for_precise_bn", "rank_quota",
           "METHODS", "SYNC_BN_MODES"]

METHODS = ("pooled", "batch_average")
"""update_bn_stats's methods: population mean / unbiased variance, or pycls's average of batch statistics."""
SYNC_BN_MODES = ("auto", "local", "global")
"""How SyncBN layers normalise during the pass: auto, this rank's statistics, or the ranks in lockstep."""


# ------------------------------------------------------------------------------- which layers
def _skip_reason(m):
    """None for a layer precise BN updates, the reason for a norm layer it skips, "" for other modules."""
    if is_frozen_bn(m):
        return "FrozenBatchNorm2d"
    if is_bn(m):
        if not has_running_stats(m):
            return "BN without running stats"
        if getattr(m, "freeze", False):
            return "BN with freeze=True"
        return None
    if isinstance(m, OTHER_NORM_TYPES):
        return type(m).__name__
    return ""


def bn_layers_for_precise_bn(model: M.Module) -> Tuple[List[Tuple[str, M.Module]], Dict[str, int]]:
    """The BN layers precise BN updates, and the norm layers it leaves alone.

    Args:
        model: the model.

    Returns:
        ``(layers, skipped)``: ``[(name, module)]``, and ``{reason: count}`` of the layers left alone
        (FrozenBN, freeze=True, no running stats, GroupNorm/InstanceNorm/LayerNorm).
    """
    layers, skipped = [], {}
    for name, m in model.named_modules():
        reason = _skip_reason(m)
        if reason is None:
            layers.append((name, m))
        elif reason:
            skipped[reason] = skipped.get(reason, 0) + 1
    return layers, skipped


def rank_quota(num_samples: Optional[int], rank: int, world: int) -> Optional[int]:
    """Samples rank ``rank`` of ``world`` processes takes: ``num_samples // world``, plus one for the first
    ``num_samples % world`` ranks (so the quotas add up to ``num_samples``).

    Args:
        num_samples: samples over all ranks; None: unlimited.
        rank: this process's rank.
        world: the number of processes.

    Returns:
        The rank's quota, or None (unlimited).

    Raises:
        ValueError: num_samples below 0.
    """
    if num_samples is None:
        return None
    num_samples = int(num_samples)
    if num_samples < 0:
        raise ValueError(f"num_samples must be >= 0, got {num_samples}")
    return num_samples // world + (1 if rank < num_samples % world else 0)


def _resolve_sync_mode(sync_bn, model, world):
    """``"local"`` or ``"global"`` for ``sync_bn`` in SYNC_BN_MODES (see docs/bn_design.md)."""
    if sync_bn not in SYNC_BN_MODES:
        raise ValueError(f"precise BN sync_bn must be one of {SYNC_BN_MODES}, got {sync_bn!r}")
    syncing = [m for m in model.modules() if is_sync_bn(m) and not getattr(m, "freeze", False)]
    if sync_bn == "auto":
        return "global" if world > 1 and syncing else "local"
    if (sync_bn == "local" and world > 1 and dist.backend() == "nccl"
            and any(isinstance(m, M.SyncBatchNorm) for m in syncing)):
        logger.warning("precise BN: MegEngine's SyncBatchNorm has no local mode (convert it with "
                       "basebn.layers.convert_sync_batchnorm); running the ranks in lockstep (sync_bn='global')")
        return "global"
    return sync_bn


# ------------------------------------------------------------------------------- batches
def _images_of(batch):
    """The images of a batch: ``(images, labels, ...)`` / ``[images, ...]`` / a dict with 'image(s)' / bare images."""
    if isinstance(batch, dict):
        for key in ("images", "image", "img", "data", "inputs"):
            if key in batch:
                return batch[key]
        raise TypeError(f"precise BN: cannot find the images in a batch dict with keys {sorted(batch)}")
    if isinstance(batch, (tuple, list)):
        if not batch:
            raise TypeError("precise BN: empty batch tuple")
        return batch[0]
    return batch


def _batch_len(images):
    shape = images.shape
    if len(shape) == 0:
        raise TypeError("precise BN: a batch of images must have a leading batch axis")
    return int(shape[0])


def _iterate(loader, quota):
    """The image batches of ``loader`` (as Tensors) until ``quota`` samples (None: all); the last one cut."""
    seen = 0
    if quota is not None and quota <= 0:
        return
    source = iter(loader)
    try:
        for batch in source:
            images = _images_of(batch)
            n = _batch_len(images)
            if n == 0:
                continue
            if quota is not None and seen + n > quota:
                images = images[:quota - seen]
                n = quota - seen
            yield images if isinstance(images, mge.Tensor) else mge.tensor(np.asarray(images))
            seen += n
            if quota is not None and seen >= quota:
                return
    finally:
        if hasattr(source, "close"):  # stop a generator-based loader (and its prefetch thread) now
            source.close()


def _lockstep(batches, world):
    """``batches`` while every rank still has one: one tiny all_reduce per step keeps SyncBN collectives matched."""
    it = iter(batches)
    while True:
        images = next(it, None)
        ready = int(dist.all_reduce_sum(np.array([images is not None], dtype=np.int64))[0])
        if ready < world:
            return
        yield images


# ------------------------------------------------------------------------------- statistics
class _LayerStats:
    """One layer's statistics: pooled :class:`Moments` and the ``batch_average`` sums (float64)."""

    def __init__(self, channels):
        self.channels = channels
        self.moments = empty_moments(channels)
        self.batches = 0.0
        self.sum_mean = np.zeros(channels)
        self.sum_var = np.zeros(channels)

    def add_batch(self, batch):
        """Merge one batch's :class:`Moments`."""
        self.moments = merge_moments(self.moments, batch)
        self.batches += 1
        self.sum_mean = self.sum_mean + batch.mean
        self.sum_var = self.sum_var + batch.unbiased_var()

    def merge(self, other):
        """Merge another rank's statistics of the same layer."""
        self.moments = merge_moments(self.moments, other.moments)
        self.batches += other.batches
        self.sum_mean = self.sum_mean + other.sum_mean
        self.sum_var = self.sum_var + other.sum_var

    def pack(self):
        """``[count, mean(C), m2(C), batches, sum_mean(C), sum_var(C)]``."""
        m = self.moments
        return np.concatenate([[m.count], m.mean, m.m2, [self.batches], self.sum_mean, self.sum_var])

    @classmethod
    def unpack(cls, row, c):
        """Inverse of :meth:`pack`."""
        out = cls(c)
        out.moments = Moments(row[0], row[1:1 + c], row[1 + c:1 + 2 * c])
        out.batches = row[1 + 2 * c]
        out.sum_mean, out.sum_var = row[2 + 2 * c:2 + 3 * c], row[2 + 3 * c:2 + 4 * c]
        return out

    def result(self, method):
        """``(mean, var)`` of ``method`` (``var`` unbiased)."""
        if method == "pooled":
            return self.moments.mean, self.moments.unbiased_var()
        return self.sum_mean / self.batches, self.sum_var / self.batches


class _InputMoments:
    """Forward pre-hooks on the layers that take the moments of each BN input with ``bn_ops.bn_stats``."""

    def __init__(self, layers):
        self.pending = []  # (layer index, count, mean tensor, m2 tensor) of the current batch
        self.handles = [m.register_forward_pre_hook(self._hook(i)) for i, (_, m) in enumerate(layers)]

    def _hook(self, idx):
        def hook(module, inputs):
            x = inputs[0] if inputs else None
            if not isinstance(x, mge.Tensor) or not 2 <= x.ndim <= 5 or bn_ops.channel_count(x) == 0:
                return None
            x = x.detach()
            if np.dtype(x.dtype) not in (np.float32, np.float16):
                x = x.astype("float32")
            mean, m2 = bn_ops.bn_stats(x)
            self.pending.append((idx, bn_ops.channel_count(x), mean, m2))
            return None

        return hook

    def take(self):
        """``[(layer index, Moments)]`` of the batch just run: one device -> host transfer for all layers."""
        if not self.pending:
            return []
        flat = F.concat([t for p in self.pending for t in (p[2], p[3])]).numpy().astype(np.float64)
        out, off = [], 0
        for idx, n, mean, _ in self.pending:
            c = mean.shape[0]
            out.append((idx, Moments(float(n), flat[off:off + c], flat[off + c:off + 2 * c])))
            off += 2 * c
        self.pending.clear()
        return out

    def remove(self):
        """Take the hooks off."""
        for h in self.handles:
            h.remove()


@contextlib.contextmanager
def _capturing_inputs(layers):
    capture = _InputMoments(layers)
    try:
        yield capture
    finally:
        capture.remove()


@contextlib.contextmanager
def _train_mode(model, layers):
    """``model`` in train mode for the block; every module's flag and each layer's momentum restored after."""
    flags = [(m, m.training) for m in model.modules()]
    momenta = [(m, m.momentum) for _, m in layers]
    try:
        model.train()
        yield
    finally:
        for m, training in flags:
            m.training = training
        for m, momentum in momenta:
            m.momentum = momentum


@contextlib.contextmanager
def _closing(batches, bar):
    """Close the progress display and the batch generator (the loader releases its workers) at the end."""
    try:
        with bar:
            yield
    finally:
        batches.close()


def _expected_batches(loader, quota, first_batch):
    """Batches the pass will run: the loader's length, fewer when `quota` samples take fewer batches of the
    first batch's size; None when neither is known."""
    total = len(loader) if hasattr(loader, "__len__") else None
    if quota is not None and first_batch:
        needed = math.ceil(quota / first_batch)
        total = needed if total is None else min(total, needed)
    return total


def _local_pass(model, layers, loader, quota, mode, progress):
    """Run this rank's batches; returns (per-layer :class:`_LayerStats`, samples, batches)."""
    stats = [_LayerStats(int(m.num_features)) for _, m in layers]
    samples = batches_run = 0
    world = dist.get_world_size()
    batches = _iterate(loader, quota)
    bar = ProgressDisplay(_expected_batches(loader, None, 0), "precise BN", "batches", enabled=progress,
                          rank=dist.get_rank())
    with contextlib.ExitStack() as stack:
        stack.enter_context(_closing(batches, bar))
        capture = stack.enter_context(_capturing_inputs(layers))
        stack.enter_context(_train_mode(model, layers))
        if mode == "local":
            stack.enter_context(local_statistics(model))
        for images in (_lockstep(batches, world) if mode == "global" and world > 1 else batches):
            capture.pending.clear()
            model(images)
            samples += _batch_len(images)
            batches_run += 1
            for idx, moments in capture.take():
                stats[idx].add_batch(moments)
            if batches_run == 1:
                bar.total = _expected_batches(loader, quota, _batch_len(images))
            bar.update(1)
    return stats, samples, batches_run


def _combine_ranks(stats, samples, batches):
    """ONE all_gather of every rank's packed statistics, merged in rank order on every rank.

    Returns (merged per-layer stats, per-rank samples, per-rank batches)."""
    world = dist.get_world_size()
    local = np.concatenate([[float(samples), float(batches)]] + [s.pack() for s in stats])
    gathered = np.asarray(dist.all_gather(local), dtype=np.float64).reshape(world, -1)
    merged, off = [], 2
    for s in stats:
        c, width = s.channels, 2 + 4 * s.channels
        total = _LayerStats(c)
        for row in gathered[:, off:off + width]:
            total.merge(_LayerStats.unpack(row, c))
        merged.append(total)
        off += width
    return merged, [int(v) for v in gathered[:, 0]], [int(v) for v in gathered[:, 1]]


def _run_pass(model, layers, loader, num_samples, progress, sync_bn):
    """Statistics of each of ``layers`` (:func:`bn_layers_for_precise_bn`) over ``loader``, merged over ranks.

    Returns (per-layer stats, in the order of ``layers``; info). Leaves the model as it found it except
    for the running statistics of BN layers whose own forward moved them (the caller writes or restores them).
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    mode = _resolve_sync_mode(sync_bn, model, world)
    t0 = time.perf_counter()
    stats, samples, batches = _local_pass(model, layers, loader, rank_quota(num_samples, rank, world), mode, progress)
    seconds = time.perf_counter() - t0
    stats, per_rank_samples, per_rank_batches = _combine_ranks(stats, samples, batches)
    info = {"seconds": seconds, "sync_bn": mode, "samples": sum(per_rank_samples),
            "batches": sum(per_rank_batches), "per_rank_samples": per_rank_samples,
            "per_rank_batches": per_rank_batches}
    return stats, info


# ------------------------------------------------------------------------------- public API
def _log_skipped(skipped):
    if skipped and dist.is_main_process():
        parts = ", ".join(f"{k} x{v}" for k, v in sorted(skipped.items()))
        logger.info(f"precise BN: skipping {sum(skipped.values())} norm layer(s) without updatable "
                    f"running statistics ({parts})")


def _check_method(method):
    if method not in METHODS:
        raise ValueError(f"precise BN method must be one of {METHODS}, got {method!r}")


def _snapshot(layers):
    """``[(module, running mean, running var)]`` copies, in the order of ``layers``."""
    return [(m, m.running_mean.numpy().copy(), m.running_var.numpy().copy()) for _, m in layers]


def _restore(snapshot):
    for m, mean, var in snapshot:
        _write(m.running_mean, mean)
        _write(m.running_var, var)


def _write(dst, value):
    """Overwrite ``dst`` in place (same Tensor object: optimizers / EMA holding it stay valid)."""
    dst[...] = mge.tensor(np.asarray(value, dtype=np.float32).reshape(tuple(dst.shape)), dtype=dst.dtype,
                          device=dst.device)


def collect_bn_population_stats(model: M.Module, loader: Iterable[Any], num_samples: Optional[int] = 8192, *,
                                method: str = "pooled", sync_bn: str = "auto",
                                progress: bool = False) -> Dict[str, Tuple[int, np.ndarray, np.ndarray]]:
    """Per-layer statistics over up to ``num_samples`` samples (across ranks), writing nothing.

    Every rank must call it (collectives as in :func:`update_bn_stats`); every rank gets the same
    result. The model's running statistics, weights, flags and momenta are left as they were.

    Args:
        model: the model.
        loader: batches, as :func:`update_bn_stats` takes them.
        num_samples: samples over all ranks; None: the whole loader on every rank.
        method: ``"pooled"`` or ``"batch_average"``.
        sync_bn: ``"auto"``, ``"local"`` or ``"global"``, as in :func:`update_bn_stats`.
        progress: show the pass's batches done of total (rank 0).

    Returns:
        ``{name: (count, mean, var)}`` for every layer :func:`update_bn_stats` would update and that received
        data: ``count`` the number of values per channel (samples x spatial positions), ``mean`` / ``var``
        float64 arrays of shape (C,) as ``method`` defines them (``var`` unbiased).

    Raises:
        ValueError: an unknown method or sync_bn mode.
    """
    _check_method(method)
    layers, _ = bn_layers_for_precise_bn(model)
    snapshot = _snapshot(layers)
    try:
        stats, _ = _run_pass(model, layers, loader, num_samples, progress, sync_bn)
    finally:
        _restore(snapshot)
    out = {}
    for (name, _), st in zip(layers, stats):
        if st.moments.count > 0:
            mean, var = st.result(method)
            out[name] = (int(round(st.moments.count)), mean, var)
    return out


def update_bn_stats(model: M.Module, loader: Iterable[Any], num_samples: Optional[int] = 8192, *,
                    method: str = "pooled", sync_bn: str = "auto", progress: bool = False) -> Dict[str, Any]:
    """Recompute the running statistics of every BN layer of ``model`` over ``loader``.

    Args:
        model: a megengine Module. Its weights are not changed; its flags and momenta are restored.
        loader: any iterable of batches: ``(images, labels)`` pairs (or longer tuples / lists), dicts
            with an ``"image(s)"`` key, or bare images; numpy arrays or megengine Tensors; batch sizes
            may vary.
        num_samples: samples to use over all ranks (per-rank quota ``num_samples // world``, the
            remainder to the first ranks); ``None`` = the whole loader on every rank.
        method: ``"pooled"`` (population mean / unbiased variance) or ``"batch_average"`` (pycls).
        sync_bn: ``"auto"``, ``"local"`` or ``"global"``: how SyncBN layers normalise during the pass
            (local statistics, or the ranks in lockstep; auto: global when several ranks hold SyncBN).
        progress: show the pass's batches done of total, and a summary log line (rank 0; the CLIs and the
            trainer's hooks pass True, a library call shows nothing by default).

    Every rank must call it (one ``all_gather`` at the end; with ``sync_bn="global"`` also one tiny
    ``all_reduce_sum`` per batch). Returns a summary dict: ``samples`` and ``batches`` used over all
    ranks, ``layers`` updated, ``skipped`` ({kind: count}), ``untouched`` (BN layers no batch
    reached), ``method``, ``sync_bn`` (the mode used), ``requested``, ``per_rank_samples``,
    ``per_rank_batches``, ``seconds``. Nothing is written when the pass fails or sees no sample.
    """
    _check_method(method)
    layers, skipped = bn_layers_for_precise_bn(model)  # the one walk: the snapshot, the pass and the log use it
    _log_skipped(skipped)
    snapshot = _snapshot(layers)
    try:
        stats, info = _run_pass(model, layers, loader, num_samples, progress, sync_bn)
    except BaseException:
        _restore(snapshot)
        raise
    summary = {"method": method, "layers": 0, "skipped": skipped, "untouched": [], "requested": num_samples,
               **info}
    if info["samples"] == 0:
        _restore(snapshot)
        logger.warning("precise BN: the loader gave no samples on any rank (empty loader or num_samples=0); "
                       "BN running statistics left unchanged")
        return summary
    for (name, m), (_, mean0, var0), st in zip(layers, snapshot, stats):
        if st.moments.count <= 0:
            _write(m.running_mean, mean0)
            _write(m.running_var, var0)
            summary["untouched"].append(name)
            continue
        mean, var = st.result(method)
        _write(m.running_mean, mean)
        _write(m.running_var, var)
        summary["layers"] += 1
    _log_summary(summary, num_samples, progress)
    return summary


def _log_summary(summary, num_samples, progress):
    if not dist.is_main_process():
        return
    if summary["untouched"]:
        logger.warning(f"precise BN: {len(summary['untouched'])} BN layer(s) received no input and keep "
                       f"their statistics: {', '.join(summary['untouched'][:10])}")
    if progress:
        samples = summary["samples"]
        short = (f" (asked for {num_samples}: the loader ran out)"
                 if num_samples is not None and samples < num_samples else "")
        logger.info(f"precise BN ({summary['method']}, SyncBN {summary['sync_bn']}): {summary['layers']} BN "
                    f"layer(s) from {samples} samples in {summary['batches']} batches over "
                    f"{dist.get_world_size()} rank(s){short}, {summary['seconds']:.1f}s")
