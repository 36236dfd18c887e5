"""BatchLoader: sharded, deterministic numpy batches, built in-process or by worker processes.

A train batch depends only on (seed, epoch, rank, batch index): the epoch's indices come from
sampler.py; in-memory datasets get the vectorised pad-crop/flip from
``default_rng([_AUG_TAG, seed, epoch, rank, batch])`` followed (same generator) by the optional
``batch_augment``; per-sample datasets (image folders) decode sample i of the batch and run
``sample_transform`` with ``default_rng([_AUG_TAG, seed, epoch, rank, batch, i])``; the optional
``mixer`` (Mixup/CutMix) then uses ``default_rng([_MIX_TAG, seed, epoch, rank, batch])``. So 0, 1
or N workers give bit-identical batches, and a resumed run sees what an uninterrupted one sees.
Eval mode: no shuffling or augmentation; rank r takes indices r::world_size in order.
"""

import queue
import threading
import weakref
from typing import Callable, Iterator, List, Optional, Sequence, Tuple

import numpy as np
from loguru import logger

from .base import Dataset, Subset
from .errors import DataError, NoFullBatchError
from .sampler import (check_class_batches, class_batch_indices, repeated_aug_indices, repeated_aug_length,
                      shard_indices)
from .transforms import crop_flip, normalize, resolve_stats, sample_crop_flip
from .workers import WorkerPool

__all__ = ["BatchLoader", "resolve_prefetch"]

_AUG_TAG = 0xA06   # separates the augmentation streams from the permutation stream
_MIX_TAG = 0x313   # the Mixup/CutMix stream of a batch
_SKIP_TAG = 0x5C1  # which sample replaces an unreadable image
_MAX_REPLACEMENTS = 16
_END = object()


class _Failure:
    def __init__(self, exc: BaseException):
        self.exc = exc


def resolve_prefetch(prefetch) -> int:
    """``data.prefetch`` as a number of batches ahead: None/True -> 2, False -> 0, int -> itself."""
    if prefetch is False:
        return 0
    if prefetch is None or prefetch is True:
        return 2
    return int(prefetch)


class BatchLoader:
    """Iterate ``(images float32 (B, C, H, W), labels)`` numpy batches, in batch order.

    Labels are int32 (B,), or float32 soft targets (B, num_classes) when a ``mixer`` is set.

    Args:
        dataset: any dataset with the basebn.data interface.
        batch_size: per-rank batch size.
        train: shuffle + augment + drop_last by default; else sequential, no augmentation.
        seed: base seed for permutations and augmentation.
        rank, world_size: data-parallel sharding.
        pad, hflip: vectorised zero-pad random crop / horizontal flip (train, in-memory path).
        mean, std: per-channel stats in 0-255 units (None: the dataset's defaults).
        drop_last: drop the last incomplete batch (default: True in train, False in eval).
        prefetch: batches prepared ahead, per worker (0 workers: by one background thread).
        max_samples: use only the first N samples of a fixed permutation of the dataset.
        num_workers: worker processes building batches (0: in this process).
        repeated_aug: each index this many times per epoch over the ranks (sampler.py).
        classes_per_batch, examples_per_class: train batches of this many classes, in same-label groups of
            examples_per_class (None: one group per class); 0 = off (sampler.class_batch_indices).
        sample_transform: ``(uint8 HWC image, rng) -> float32 CHW``; when set every sample is
            loaded and transformed on its own (``dataset.load``) and pad/hflip are not used.
        image_shape: (C, H, W) that ``sample_transform`` produces (default: the dataset's).
        batch_augment: ``(float32 NCHW, rng) -> float32 NCHW`` after pad-crop/flip (train).
        mixer: ``(x, int labels, rng) -> (x, soft targets (B, num_classes))`` (train).
        num_classes: soft-target width for the mixer (default: the dataset's).
        skip_bad_images: instead of raising DataError, replace an unreadable image by another sample
            (deterministically) in training, leave it out in evaluation (a shorter batch), and count
            them in one warning when the epoch's last batch is handed over.
    """

    def __init__(self, dataset: Dataset, batch_size: int, *, train: bool, seed: int = 0,
                 rank: int = 0, world_size: int = 1, pad: int = 4, hflip: bool = True,
                 mean: Optional[Sequence[float]] = None, std: Optional[Sequence[float]] = None,
                 drop_last: Optional[bool] = None, prefetch=2, max_samples: Optional[int] = None,
                 num_workers: int = 0, repeated_aug: int = 1, classes_per_batch: int = 0,
                 examples_per_class: Optional[int] = None,
                 sample_transform: Optional[Callable] = None, image_shape=None,
                 batch_augment: Optional[Callable] = None, mixer: Optional[Callable] = None,
                 num_classes: Optional[int] = None, skip_bad_images: bool = False):
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank={rank} "
                             f"world_size={world_size}")
        if seed < 0:
            raise ValueError(f"seed must be non-negative, got {seed}")
        if num_workers < 0 or repeated_aug < 1:
            raise ValueError(f"need num_workers >= 0 and repeated_aug >= 1, got {num_workers}, "
                             f"{repeated_aug}")
        self.dataset = Subset.first_n(dataset, max_samples)
        self.batch_size = int(batch_size)
        self.train = bool(train)
        self.seed = int(seed)
        self.rank, self.world_size = int(rank), int(world_size)
        self.pad = int(pad) if train else 0
        self.hflip = bool(hflip) and train
        self.mean, self.std = resolve_stats(self.dataset, mean, std)
        self.drop_last = self.train if drop_last is None else bool(drop_last)
        self.prefetch = resolve_prefetch(prefetch)
        self.num_workers = int(num_workers)
        self.repeated_aug = int(repeated_aug) if train else 1
        self.classes_per_batch = int(classes_per_batch or 0) if train else 0
        self.examples_per_class = examples_per_class
        if self.classes_per_batch and self.repeated_aug > 1:
            raise ValueError("classes_per_batch and repeated_aug > 1 cannot be combined")
        self.sample_transform = sample_transform
        self.image_shape = tuple(image_shape or self.dataset.image_shape)
        self.batch_augment = batch_augment if train else None
        self.mixer = mixer if train else None
        self.num_classes = int(num_classes or self.dataset.num_classes)
        self.skip_bad_images = bool(skip_bad_images)
        self.epoch: Optional[int] = None
        self._pool: Optional[WorkerPool] = None
        self._finalizer: Optional[weakref.finalize] = None
        self._plan: Tuple[Optional[int], Optional[np.ndarray]] = (None, None)  # (epoch, indices)

        n = len(self.dataset)
        if not self.train:
            self.num_samples = len(range(self.rank, n, self.world_size))
        elif self.repeated_aug > 1:
            self.num_samples = repeated_aug_length(n, self.world_size)
        elif self.classes_per_batch:  # whole batches only
            check_class_batches(self.dataset.labels, self.batch_size, self.classes_per_batch, examples_per_class)
            self.num_samples = n // self.world_size // self.batch_size * self.batch_size
        else:
            self.num_samples = n // self.world_size
        if self.drop_last:
            self.num_batches = self.num_samples // self.batch_size
        else:
            self.num_batches = -(-self.num_samples // self.batch_size)
        if self.train and self.num_batches == 0:
            raise NoFullBatchError(
                f"dataset {self.dataset.name} ({n} samples) is too small for batch_size="
                f"{batch_size} x world_size={world_size} with drop_last: no full batch per epoch. "
                f"Lower the batch size or raise max_train_samples.", self.num_samples)

    def __len__(self) -> int:
        return self.num_batches

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose permutation and augmentation the next iteration uses."""
        if epoch < 0:
            raise ValueError(f"epoch must be non-negative, got {epoch}")
        self.epoch = int(epoch)

    # ----------------------------------------------------------------- index plans
    def epoch_indices(self, epoch: Optional[int] = None) -> np.ndarray:
        """This rank's sample indices for ``epoch`` in iteration order (before drop_last)."""
        n = len(self.dataset)
        if not self.train:
            return np.arange(self.rank, n, self.world_size)
        epoch = self._require_epoch() if epoch is None else int(epoch)
        if self.repeated_aug > 1:
            return repeated_aug_indices(n, self.seed, epoch, self.rank, self.world_size,
                                        self.repeated_aug)
        if self.classes_per_batch:
            return class_batch_indices(self.dataset.labels, self.batch_size, self.classes_per_batch,
                                       self.examples_per_class, self.seed, epoch, self.rank, self.world_size)
        return shard_indices(n, self.seed, epoch, self.rank, self.world_size)

    def batch_indices(self, epoch: Optional[int] = None) -> List[np.ndarray]:
        """This rank's batches of sample indices for ``epoch``."""
        idx = self.epoch_indices(epoch)
        bs = self.batch_size
        return [idx[b * bs:(b + 1) * bs] for b in range(self.num_batches)]

    def aug_rng(self, epoch: int, batch: int) -> np.random.Generator:
        """The generator of batch ``batch``'s vectorised augmentation."""
        return np.random.default_rng([_AUG_TAG, self.seed, int(epoch), self.rank, int(batch)])

    def sample_rng(self, epoch: int, batch: int, i: int) -> np.random.Generator:
        """The generator of sample ``i`` of batch ``batch`` (per-sample transforms)."""
        return np.random.default_rng([_AUG_TAG, self.seed, int(epoch), self.rank, int(batch), int(i)])

    def mix_rng(self, epoch: int, batch: int) -> np.random.Generator:
        """The generator of batch ``batch``'s Mixup/CutMix."""
        return np.random.default_rng([_MIX_TAG, self.seed, int(epoch), self.rank, int(batch)])

    def _require_epoch(self) -> int:
        if self.epoch is None:
            raise RuntimeError("BatchLoader(train=True): call set_epoch(epoch) before iterating")
        return self.epoch

    # ----------------------------------------------------------------- batches
    def build_batch(self, epoch: int, batch: int) -> Tuple[np.ndarray, np.ndarray, List[str]]:
        """Batch ``batch`` of ``epoch``: (images, labels, messages of replaced unreadable images)."""
        if self._plan[0] != epoch:  # the permutation is computed once per epoch and process
            self._plan = (epoch, self.epoch_indices(epoch))
        indices = self._plan[1][batch * self.batch_size:(batch + 1) * self.batch_size]
        if self.sample_transform is not None:
            x, y, replaced = self._per_sample_batch(indices, epoch, batch)
        else:
            x, y, replaced = self._vectorised_batch(indices, epoch, batch)
        if self.mixer is not None:
            x, y = self.mixer(x, y, self.mix_rng(epoch, batch))
            y = np.ascontiguousarray(y, dtype=np.float32)
        return np.ascontiguousarray(x, dtype=np.float32), y, replaced

    def _vectorised_batch(self, indices, epoch, batch):
        images = self.dataset.get_images(indices)
        rng = self.aug_rng(epoch, batch) if self.train else None
        if self.train and (self.pad > 0 or self.hflip):
            ys, xs, flips = sample_crop_flip(rng, len(images), self.pad, self.hflip)
            images = crop_flip(images, self.pad, ys, xs, flips)
        x = normalize(images, self.mean, self.std)
        if self.batch_augment is not None:
            x = self.batch_augment(x, rng)
        y = np.ascontiguousarray(self.dataset.labels[indices], dtype=np.int32)
        return x, y, []

    def _per_sample_batch(self, indices, epoch, batch):
        x = np.empty((len(indices),) + self.image_shape, np.float32)
        y = np.empty(len(indices), np.int32)
        bad: List[str] = []
        kept = 0
        for i, index in enumerate(indices):
            loaded = self._load(int(index), epoch, batch, i, bad)
            if loaded is None:  # evaluation leaves a bad image out (counted in ``bad``)
                continue
            image, index = loaded
            x[kept] = self.sample_transform(image, self.sample_rng(epoch, batch, i))
            y[kept] = self.dataset.labels[index]
            kept += 1
        return x[:kept], y[:kept], bad

    def _load(self, index: int, epoch, batch: int, i: int, bad: List[str]):
        """(image, index) of ``index``; with skip_bad_images an unreadable image is replaced by deterministic
        other samples in training and left out (None) in evaluation, and its message appended to ``bad``."""
        for attempt in range(_MAX_REPLACEMENTS):
            try:
                return self.dataset.load(index), index
            except DataError as e:
                if not self.skip_bad_images:
                    raise DataError(f"{e}; or set data.skip_bad_images=True to "
                                    f"{'train on' if self.train else 'evaluate'} without it") from e
                bad.append(str(e))
                if not self.train:
                    return None
                rng = np.random.default_rng([_SKIP_TAG, self.seed, int(epoch or 0), self.rank,
                                             int(batch), int(i), attempt])
                index = int(rng.integers(len(self.dataset)))
        raise DataError(f"{_MAX_REPLACEMENTS} unreadable images in a row (the last: "
                        f"{bad[-1]}); data.skip_bad_images cannot help, check data.root")

    # ----------------------------------------------------------------- iteration
    def __iter__(self) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
        epoch = self._require_epoch() if self.train else (self.epoch or 0)
        if self.num_workers > 0 and self.num_batches > 0:
            source = self._from_workers(epoch)
        elif self.prefetch > 0 and self.num_batches > 1:
            source = self._prefetched(epoch)
        else:
            source = (self.build_batch(epoch, b) for b in range(self.num_batches))
        return self._reported(source, epoch)

    def _reported(self, source, epoch: int):
        """Yield (x, y) (an evaluation batch whose images were all left out: not at all), and warn about the
        epoch's unreadable images when its last batch is handed over: a trainer takes exactly len(loader)
        batches and never asks for the end of the iteration."""
        bad: List[str] = []
        for b, (x, y, bad_here) in enumerate(source):
            bad += bad_here
            if b == self.num_batches - 1 and bad:
                self._warn_bad_images(bad, epoch)
            if len(y):
                yield x, y

    def _warn_bad_images(self, bad: List[str], epoch: int) -> None:
        if self.train:  # epochs counted from 1, as the training log does
            what = f"replaced by other samples {len(bad)} time(s) in epoch {epoch + 1}"
        else:
            after = f" after epoch {self.epoch + 1}" if self.epoch is not None else ""
            what = (f"left out of the evaluation{after} ({self.dataset.split} split; the metrics count the "
                    f"other images)")
        logger.warning(f"data: {len(set(bad))} unreadable image(s) {what} (data.skip_bad_images=True); "
                       f"first: {bad[0]}")

    @property
    def worker_pids(self) -> List[int]:
        """Process ids of the running workers (empty before the first iteration or with 0)."""
        return [] if self._pool is None or self._pool.closed else self._pool.pids

    def _from_workers(self, epoch: int):
        if self._pool is None or self._pool.closed:
            c, h, w = self.image_shape
            label_bytes = self.batch_size * (4 * self.num_classes if self.mixer else 4)
            self._pool = WorkerPool(self.build_batch, self.num_workers, max(1, self.prefetch),
                                    self.batch_size * c * h * w * 4, label_bytes)
            if self._finalizer is not None:
                self._finalizer.detach()
            self._finalizer = weakref.finalize(self, self._pool.close)  # the loader's end stops them
        pool = self._pool
        try:
            yield from pool.batches(epoch, self.num_batches)
        finally:
            if not self.train:  # eval loaders run rarely: free the processes in between
                pool.close()

    def close(self) -> None:
        """Stop the worker processes (a later iteration starts new ones)."""
        if self._pool is not None:
            self._pool.close()

    def _prefetched(self, epoch: int):
        q: "queue.Queue" = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()

        def put(item) -> bool:
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        def worker():
            try:
                for b in range(self.num_batches):
                    if not put(self.build_batch(epoch, b)):
                        return
            except BaseException as e:  # handed to the consumer, re-raised there
                put(_Failure(e))
                return
            put(_END)

        t = threading.Thread(target=worker, name="basebn-prefetch", daemon=True)
        t.start()
        try:
            while True:
                item = q.get()
                if item is _END:
                    return
                if isinstance(item, _Failure):
                    raise item.exc
                yield item
        finally:  # also runs when the consumer stops early (generator closed / collected)
            stop.set()
            try:
                while True:
                    q.get_nowait()
            except queue.Empty:
                pass
            t.join(timeout=5.0)
