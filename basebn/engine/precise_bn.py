"""Precise BN: recompute BatchNorm running statistics as population statistics of the frozen model.

During training a BN layer's ``running_mean``/``running_var`` are an exponential moving average of
batch statistics taken while the weights move, so they lag behind the final weights and are noisy.
Precise BN ("Rethinking 'Batch' in BatchNorm", Wu & Johnson 2021; fvcore/pycls/basecls) freezes the
weights and re-estimates the statistics over a few thousand training samples.

:func:`update_bn_stats` / :func:`collect_bn_population_stats`:

* **Which layers.** Every BatchNorm-family layer that tracks running statistics: ``megengine.module``
  BatchNorm1d / BatchNorm2d / SyncBatchNorm and :class:`basebn.layers.SyncBatchNorm` (any subclass
  of MegEngine's ``_BatchNorm``). Not updated: :class:`~basebn.layers.FrozenBatchNorm2d`, BN layers
  built with ``freeze=True`` or ``track_running_stats=False``, and GroupNorm / InstanceNorm /
  LayerNorm (no running statistics); one log line names how many of each were skipped.
* **Features as in training.** The whole model runs in train mode (each BN normalises with the
  statistics of its current batch, so later layers see train-mode features; dropout is active as in
  training). Each BN layer's *input* is captured by a forward pre-hook; its per-channel count, mean
  and M2 (sum of squared deviations) are computed on the device (float32, two-pass) and
  accumulated across batches with Chan's parallel formula in float64. Weights are never touched
  (no GradManager, no optimizer); every module's train/eval flag and every BN's momentum are
  restored; nothing is written when the pass fails.
* **Methods.** ``"pooled"`` (default): ``running_mean`` = mean over all samples seen, ``running_var``
  = unbiased variance over all samples = (sum of per-batch M2 + sum_b n_b (mean_b - mean)^2) /
  (N - 1), i.e. the count-weighted within-batch variance *plus* the variance of the batch means.
  ``"batch_average"``: the pycls / basecls / mmpretrain estimate kept for comparison: the plain
  average over batches of the batch means and of the unbiased batch variances. It misses the
  between-batch term, so it underestimates the population variance whenever batch means differ
  (always, with small batches) -- the very quantity eval-mode BN divides by.
* **Sample budget across ranks.** ``num_samples`` counts samples over all ranks. Each rank gets a
  fixed quota, ``num_samples // world`` plus one for the first ``num_samples % world`` ranks, and
  takes batches from its loader until its quota is met; the batch that would overshoot is cut to
  the remaining quota, so at most ``num_samples`` samples are used in total (fewer only if a loader
  runs out, which is logged). Quotas need no communication during the pass.
* **SyncBN during the pass** (``sync_bn=``). SyncBN layers communicate inside every train-mode
  forward, so a rank that runs more batches than another would wait forever. Two safe ways:

  - ``"local"``: every SyncBatchNorm (basebn's and MegEngine's) temporarily normalises with its
    *local* batch statistics (its instance ``forward`` is swapped for a local one, restored after),
    so no collective happens inside the pass and ranks may run any number of batches (uneven
    loaders, cut batches). Intermediate features are normalised per rank rather than over the
    global batch, as plain BN does anyway; the result equals a single process's over the union of
    the ranks' batches.
  - ``"global"``: SyncBN runs as in training (features normalised over the global batch) and the
    ranks stay in lockstep: before each forward one tiny ``all_reduce_sum`` counts the ranks that
    still have a batch, and all ranks stop as soon as one has none (so a rank with more data than
    the others leaves the rest unused). The result equals a single process's over the per-step
    concatenation of the ranks' batches.

  ``"auto"`` (default): ``"global"`` when more than one rank runs and the model holds a SyncBN
  layer (features exactly as in training -- what matters with small per-rank batches, the reason to
  use SyncBN), else ``"local"`` (no collective at all during the pass).

  Either way the statistics are exact over all ranks: after the pass ONE ``all_gather`` collects
  every rank's per-layer (count, mean, M2) and every rank combines them in rank order with the same
  float64 arithmetic, so all ranks end with bit-identical running statistics.
* **No data.** If no rank sees a sample (empty loader, ``num_samples=0``), a warning is logged and
  the statistics are left unchanged (basecls would write zeros). A BN layer that no batch reached
  (an unused branch) keeps its statistics too.
"""
import time

import numpy as np
from loguru import logger

import megengine as mge
import megengine.functional as F
import megengine.module as M
from megengine.module.batchnorm import _BatchNorm

from .. import distributed as dist
from .progress import progress_bar

__all__ = ["update_bn_stats", "collect_bn_population_stats", "bn_layers_for_precise_bn", "bn_layers", "rank_quota",
           "METHODS", "SYNC_BN_MODES"]

METHODS = ("pooled", "batch_average")
SYNC_BN_MODES = ("auto", "local", "global")

# per layer in the packed buffer: count, mean(C), m2(C), batches, sum of batch means(C), sum of batch vars(C)
_HEADER = 2  # per rank: samples, batches


def _frozen_bn_type():
    try:
        from ..layers.frozen_bn import FrozenBatchNorm2d
    except ImportError:  # pragma: no cover - the layer is optional for this module
        return ()
    return (FrozenBatchNorm2d,)


def _sync_bn_types():
    types = [M.SyncBatchNorm]
    try:
        from ..layers.sync_bn import SyncBatchNorm
    except ImportError:  # pragma: no cover
        pass
    else:
        types.append(SyncBatchNorm)
    return tuple(types)


_OTHER_NORMS = tuple(t for t in (getattr(M, "GroupNorm", None), getattr(M, "InstanceNorm", None),
                                 getattr(M, "LayerNorm", None)) if t is not None)


def bn_layers_for_precise_bn(model):
    """``(layers, skipped)``: the ``[(name, module)]`` precise BN updates, and ``{reason: count}`` of
    the norm layers it leaves alone (FrozenBN, freeze=True, no running stats, GroupNorm/InstanceNorm/LayerNorm)."""
    frozen = _frozen_bn_type()
    layers, skipped = [], {}

    def skip(reason):
        skipped[reason] = skipped.get(reason, 0) + 1

    for name, m in model.named_modules():
        if frozen and isinstance(m, frozen):
            skip("FrozenBatchNorm2d")
        elif isinstance(m, _BatchNorm):
            if getattr(m, "running_mean", None) is None or not getattr(m, "track_running_stats", True):
                skip("BN without running stats")
            elif getattr(m, "freeze", False):
                skip("BN with freeze=True")
            else:
                layers.append((name, m))
        elif _OTHER_NORMS and isinstance(m, _OTHER_NORMS):
            skip(type(m).__name__)
    return layers, skipped


def rank_quota(num_samples, rank, world):
    """Samples rank ``rank`` of ``world`` processes: ``num_samples // world``, plus one for the first
    ``num_samples % world`` ranks (so the quotas add up to ``num_samples``). ``None`` = unlimited."""
    if num_samples is None:
        return None
    num_samples = int(num_samples)
    if num_samples < 0:
        raise ValueError(f"num_samples must be >= 0, got {num_samples}")
    return num_samples // world + (1 if rank < num_samples % world else 0)


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


def _to_tensor(images):
    if isinstance(images, mge.Tensor):
        return images
    return mge.tensor(np.asarray(images))


def _local_bn_forward(bn):
    """A replacement forward for a SyncBatchNorm: batch-statistics BN over the local batch only."""

    def forward(inp):
        c = inp.shape[1]
        axes = [0] + list(range(2, inp.ndim))
        bshape = (1, c) + (1,) * (inp.ndim - 2)
        x = inp.astype("float32") if inp.dtype != np.float32 else inp
        mean = F.mean(x, axis=axes, keepdims=True)
        var = F.mean((x - mean) ** 2, axis=axes, keepdims=True)  # biased, as BN normalises in training
        y = (x - mean) / F.sqrt(var + bn.eps)
        if getattr(bn, "affine", False) and bn.weight is not None:
            y = y * bn.weight.reshape(bshape) + bn.bias.reshape(bshape)
        return y.astype(inp.dtype) if inp.dtype != np.float32 else y

    return forward


class _Accumulator:
    """Per-layer float64 accumulators: Chan's (count, mean, M2) plus the batch_average sums."""

    def __init__(self, c):
        self.count = 0.0
        self.mean = np.zeros(c)
        self.m2 = np.zeros(c)
        self.batches = 0
        self.sum_bmean = np.zeros(c)
        self.sum_bvar = np.zeros(c)

    def add(self, n, mean, m2):
        # Chan et al.: combine (count, mean, M2) of two disjoint sets
        total = self.count + n
        delta = mean - self.mean
        self.mean = self.mean + delta * (n / total)
        self.m2 = self.m2 + m2 + delta ** 2 * (self.count * n / total)
        self.count = total
        self.batches += 1
        self.sum_bmean += mean
        self.sum_bvar += m2 / max(n - 1.0, 1.0)

    def pack(self):
        return np.concatenate([[self.count], self.mean, self.m2, [self.batches], self.sum_bmean, self.sum_bvar])


def _combine_packed(rows, c):
    """Combine the packed per-rank accumulators of one layer, rank by rank (same order everywhere)."""
    count, mean, m2 = 0.0, np.zeros(c), np.zeros(c)
    batches, sum_bmean, sum_bvar = 0.0, np.zeros(c), np.zeros(c)
    for row in rows:
        n = row[0]
        r_mean, r_m2 = row[1:1 + c], row[1 + c:1 + 2 * c]
        batches += row[1 + 2 * c]
        sum_bmean = sum_bmean + row[2 + 2 * c:2 + 3 * c]
        sum_bvar = sum_bvar + row[2 + 3 * c:2 + 4 * c]
        if n <= 0:
            continue
        total = count + n
        delta = r_mean - mean
        mean = mean + delta * (n / total)
        m2 = m2 + r_m2 + delta ** 2 * (count * n / total)
        count = total
    return count, mean, m2, batches, sum_bmean, sum_bvar


def _final_stats(method, count, mean, m2, batches, sum_bmean, sum_bvar):
    if method == "pooled":
        return mean, m2 / max(count - 1.0, 1.0)
    return sum_bmean / batches, sum_bvar / batches


def _resolve_sync_mode(sync_bn, model, world):
    if sync_bn not in SYNC_BN_MODES:
        raise ValueError(f"precise BN sync_bn must be one of {SYNC_BN_MODES}, got {sync_bn!r}")
    if sync_bn != "auto":
        return sync_bn
    sync_types = _sync_bn_types()
    has_sync = any(isinstance(m, sync_types) and not getattr(m, "freeze", False) for m in model.modules())
    return "global" if world > 1 and has_sync else "local"


def _run_pass(model, loader, num_samples, progress, sync_bn):
    """Forward ``loader`` through ``model`` in train mode; returns (layers, skipped, per-layer stats
    combined over ranks, global samples, global batches, info). Leaves the model as it found it
    except for the running statistics of BN layers whose own forward moved them (the caller writes
    or restores them)."""
    layers, skipped = bn_layers_for_precise_bn(model)
    rank, world = dist.get_rank(), dist.get_world_size()
    mode = _resolve_sync_mode(sync_bn, model, world)
    lockstep = mode == "global" and world > 1
    quota = rank_quota(num_samples, rank, world)
    channels = [int(m.num_features) for _, m in layers]
    accs = [_Accumulator(c) for c in channels]
    local_samples = local_batches = 0

    pending = []  # (layer index, count, mean tensor, m2 tensor) for the current batch

    def make_hook(idx):
        def hook(module, inputs):
            x = inputs[0] if inputs else None
            if not isinstance(x, mge.Tensor) or x.ndim < 2:
                return None
            c = x.shape[1]
            n = x.size // c if c else 0
            if n == 0:
                return None
            axes = [0] + list(range(2, x.ndim))
            xf = x.detach()
            if xf.dtype != np.float32:
                xf = xf.astype("float32")
            mean = F.mean(xf, axis=axes, keepdims=True)
            m2 = F.sum((xf - mean) ** 2, axis=axes)  # two-pass: no cancellation
            pending.append((idx, n, mean.reshape(-1), m2))
            return None

        return hook

    modes = [(m, m.training) for m in model.modules()]
    momenta = [(m, m.momentum) for _, m in layers]
    handles, swapped = [], []  # swapped: (module, had an instance forward, that forward)
    batches = bar = None
    t0 = time.perf_counter()
    try:
        model.train()
        for idx, (_, m) in enumerate(layers):
            handles.append(m.register_forward_pre_hook(make_hook(idx)))
        if mode == "local":
            sync_types = _sync_bn_types()
            for m in model.modules():
                if isinstance(m, sync_types) and not getattr(m, "freeze", False):
                    swapped.append((m, "forward" in m.__dict__, m.__dict__.get("forward")))
                    object.__setattr__(m, "forward", _local_bn_forward(m))

        batches = _iterate(loader, quota)
        bar = progress_bar(batches, desc="precise BN") if progress else batches
        it = iter(bar)
        while True:
            images = next(it, None)
            if lockstep:  # every rank runs the same number of forwards: SyncBN collectives match
                ready = int(dist.all_reduce_sum(np.array([images is not None], dtype=np.int64))[0])
                if ready < world:
                    break
            if images is None:
                break
            pending.clear()
            model(images)
            local_samples += _batch_len(images)
            local_batches += 1
            if pending:  # one device->host transfer per batch for all layers
                flat = F.concat([t for p in pending for t in (p[2], p[3])]).numpy().astype(np.float64)
                off = 0
                for idx, n, mean_t, _ in pending:
                    c = mean_t.shape[0]
                    accs[idx].add(float(n), flat[off:off + c], flat[off + c:off + 2 * c])
                    off += 2 * c
            pending.clear()
    finally:
        if bar is not None and bar is not batches and hasattr(bar, "close"):
            bar.close()
        if batches is not None:
            batches.close()  # let the loader release its workers now
        for h in handles:
            h.remove()
        for m, had, old in swapped:
            if had:
                object.__setattr__(m, "forward", old)
            else:
                del m.__dict__["forward"]
        for m, training in modes:
            m.training = training
        for m, momentum in momenta:
            m.momentum = momentum
    seconds = time.perf_counter() - t0

    # ONE collective: every rank's packed accumulators, combined in rank order on every rank
    local = np.concatenate([[float(local_samples), float(local_batches)]] + [a.pack() for a in accs])
    gathered = np.asarray(dist.all_gather(local), dtype=np.float64).reshape(world, -1)
    total_samples, total_batches = int(gathered[:, 0].sum()), int(gathered[:, 1].sum())
    stats, off = [], _HEADER
    for c in channels:
        width = 2 + 4 * c
        stats.append(_combine_packed(gathered[:, off:off + width], c))
        off += width
    info = {"seconds": seconds, "sync_bn": mode, "per_rank_samples": [int(s) for s in gathered[:, 0]],
            "per_rank_batches": [int(b) for b in gathered[:, 1]]}
    return layers, skipped, stats, total_samples, total_batches, info


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
            yield _to_tensor(images)
            seen += n
            if quota is not None and seen >= quota:
                return
    finally:
        if hasattr(source, "close"):  # stop a generator-based loader (and its prefetch thread) now
            source.close()


def _log_skipped(skipped):
    if skipped and dist.is_main_process():
        parts = ", ".join(f"{k} x{v}" for k, v in sorted(skipped.items()))
        logger.info(f"precise BN: skipping {sum(skipped.values())} norm layer(s) without updatable "
                    f"running statistics ({parts})")


def _check_method(method):
    if method not in METHODS:
        raise ValueError(f"precise BN method must be one of {METHODS}, got {method!r}")


def collect_bn_population_stats(model, loader, num_samples=8192, *, method="pooled", sync_bn="auto",
                                progress=False):
    """Per-layer statistics over up to ``num_samples`` samples (across ranks), writing nothing.

    Returns ``{name: (count, mean, var)}`` for every layer :func:`update_bn_stats` would update and
    that received data: ``count`` the number of values per channel (samples x spatial positions),
    ``mean`` / ``var`` float64 arrays of shape (C,) as ``method`` defines them (``var`` unbiased).
    Every rank must call it (collectives as in :func:`update_bn_stats`); every rank gets the same
    result. The model's running statistics, weights, flags and momenta are left as they were.
    """
    _check_method(method)
    snapshot = _snapshot(model)
    try:
        layers, _, stats, _, _, _ = _run_pass(model, loader, num_samples, progress, sync_bn)
    finally:
        _restore(snapshot)
    out = {}
    for (name, _), st in zip(layers, stats):
        if st[0] > 0:
            mean, var = _final_stats(method, *st)
            out[name] = (int(round(st[0])), mean, var)
    return out


def _snapshot(model):
    layers, _ = bn_layers_for_precise_bn(model)
    return [(m, m.running_mean.numpy().copy(), m.running_var.numpy().copy()) for _, m in layers]


def _restore(snapshot):
    for m, mean, var in snapshot:
        _write(m.running_mean, mean)
        _write(m.running_var, var)


def _write(dst, value):
    """Overwrite ``dst`` in place (same Tensor object: optimizers / EMA holding it stay valid)."""
    dst[...] = mge.tensor(np.asarray(value, dtype=np.float32).reshape(tuple(dst.shape)), dtype=dst.dtype,
                          device=dst.device)


def update_bn_stats(model, loader, num_samples=8192, *, method="pooled", sync_bn="auto", progress=True):
    """Recompute the running statistics of every BN layer of ``model`` over ``loader`` (see module doc).

    Args:
        model: a megengine Module. Its weights are not changed; its flags and momenta are restored.
        loader: any iterable of batches: ``(images, labels)`` pairs (or longer tuples / lists), dicts
            with an ``"image(s)"`` key, or bare images; numpy arrays or megengine Tensors; batch sizes
            may vary.
        num_samples: samples to use over all ranks (per-rank quota ``num_samples // world``, the
            remainder to the first ranks); ``None`` = the whole loader on every rank.
        method: ``"pooled"`` (population mean / unbiased variance) or ``"batch_average"`` (pycls).
        sync_bn: ``"auto"``, ``"local"`` or ``"global"``: how SyncBN layers normalise during the pass
            (see module doc).
        progress: a progress bar (rank 0, on a terminal) and a summary log line (rank 0).

    Every rank must call it (one ``all_gather`` at the end; with ``sync_bn="global"`` also one tiny
    ``all_reduce_sum`` per batch). Returns a summary dict: ``samples`` and ``batches`` used over all
    ranks, ``layers`` updated, ``skipped`` ({kind: count}), ``untouched`` (BN layers no batch
    reached), ``method``, ``sync_bn`` (the mode used), ``requested``, ``per_rank_samples``,
    ``per_rank_batches``, ``seconds``.
    """
    _check_method(method)
    layers, skipped = bn_layers_for_precise_bn(model)
    _log_skipped(skipped)
    snapshot = _snapshot(model)
    try:
        layers, skipped, stats, samples, batches, info = _run_pass(model, loader, num_samples, progress, sync_bn)
    except BaseException:
        _restore(snapshot)
        raise
    summary = {"method": method, "samples": samples, "batches": batches, "layers": 0, "skipped": skipped,
               "untouched": [], "requested": num_samples, **info}
    if samples == 0:
        _restore(snapshot)
        logger.warning("precise BN: the loader gave no samples on any rank (empty loader or num_samples=0); "
                       "BN running statistics left unchanged")
        return summary
    for (name, m), (_, mean0, var0), st in zip(layers, snapshot, stats):
        if st[0] <= 0:
            _write(m.running_mean, mean0)
            _write(m.running_var, var0)
            summary["untouched"].append(name)
            continue
        mean, var = _final_stats(method, *st)
        _write(m.running_mean, mean)
        _write(m.running_var, var)
        summary["layers"] += 1
    if summary["untouched"] and dist.is_main_process():
        logger.warning(f"precise BN: {len(summary['untouched'])} BN layer(s) received no input and keep "
                       f"their statistics: {', '.join(summary['untouched'][:10])}")
    if progress and dist.is_main_process():
        short = (f" (asked for {num_samples}: the loader ran out)"
                 if num_samples is not None and samples < num_samples else "")
        logger.info(f"precise BN ({method}, SyncBN {info['sync_bn']}): {summary['layers']} BN layer(s) from "
                    f"{samples} samples in {batches} batches over {dist.get_world_size()} rank(s){short}, "
                    f"{info['seconds']:.1f}s")
    return summary


bn_layers = bn_layers_for_precise_bn  # short alias
