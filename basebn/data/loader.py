"""BatchLoader: sharded, deterministic, optionally prefetching numpy batches.

Train mode, epoch ``e``: the permutation is ``np.random.default_rng([seed, e])`` over the
dataset; rank ``r`` of ``w`` takes the contiguous slice ``perm[r*m:(r+1)*m]`` with
``m = len(dataset) // w`` (so every rank has the same number of batches); the augmentation
of batch ``b`` uses ``np.random.default_rng([_AUG_TAG, seed, e, r, b])``. Nothing depends on
what was iterated before, so a run resumed at epoch ``e`` sees exactly the batches an
uninterrupted run sees.

Eval mode: no shuffling or augmentation; rank ``r`` takes indices ``r::w`` in order, so the
ranks together see every sample exactly once; the last batch may be smaller.
"""

import queue
import threading
from typing import Iterator, Optional, Sequence, Tuple

import numpy as np

from .base import Dataset, Subset
from .errors import DataError
from .transforms import crop_flip, normalize, resolve_stats, sample_crop_flip

__all__ = ["BatchLoader"]

_AUG_TAG = 0xA06  # separates the augmentation streams from the permutation stream
_END = object()


class _Failure:
    def __init__(self, exc: BaseException):
        self.exc = exc


class BatchLoader:
    """Iterate ``(images float32 (B, C, H, W), labels int32 (B,))`` numpy batches.

    Args:
        dataset: any dataset with the basebn.data interface.
        batch_size: per-rank batch size.
        train: shuffle + augment + drop_last by default; else sequential, no augmentation.
        seed: base seed for permutations and augmentation.
        rank, world_size: data-parallel sharding.
        pad: zero padding for random crops (train only; 0 disables cropping).
        hflip: random horizontal flips with probability 0.5 (train only).
        mean, std: per-channel stats in 0-255 units (None: the dataset's defaults).
        drop_last: drop the last incomplete batch (default: True in train, False in eval;
            eval with drop_last=True would skip samples and is allowed only if asked for).
        prefetch: prepare the next batch in a background thread.
        max_samples: use only the first N samples of a fixed permutation of the dataset.
    """

    def __init__(self, dataset: Dataset, batch_size: int, *, train: bool, seed: int = 0,
                 rank: int = 0, world_size: int = 1, pad: int = 4, hflip: bool = True,
                 mean: Optional[Sequence[float]] = None, std: Optional[Sequence[float]] = None,
                 drop_last: Optional[bool] = None, prefetch: bool = True,
                 max_samples: Optional[int] = None):
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank={rank} "
                             f"world_size={world_size}")
        if seed < 0:
            raise ValueError(f"seed must be non-negative, got {seed}")
        self.dataset = Subset.first_n(dataset, max_samples)
        self.batch_size = int(batch_size)
        self.train = bool(train)
        self.seed = int(seed)
        self.rank, self.world_size = int(rank), int(world_size)
        self.pad = int(pad) if train else 0
        self.hflip = bool(hflip) and train
        self.mean, self.std = resolve_stats(self.dataset, mean, std)
        self.drop_last = self.train if drop_last is None else bool(drop_last)
        self.prefetch = bool(prefetch)
        self.epoch: Optional[int] = None

        n = len(self.dataset)
        if self.train:
            self.num_samples = n // self.world_size
        else:
            self.num_samples = len(range(self.rank, n, self.world_size))
        if self.drop_last:
            self.num_batches = self.num_samples // self.batch_size
        else:
            self.num_batches = -(-self.num_samples // self.batch_size)
        if self.train and self.num_batches == 0:
            raise DataError(
                f"dataset {self.dataset.name} ({n} samples) is too small for batch_size="
                f"{batch_size} x world_size={world_size} with drop_last: no full batch per epoch. "
                f"Lower the batch size or raise max_train_samples.")

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
        if epoch is None:
            epoch = self._require_epoch()
        perm = np.random.default_rng([self.seed, int(epoch)]).permutation(n)
        m = self.num_samples
        return perm[self.rank * m:(self.rank + 1) * m]

    def batch_indices(self, epoch: Optional[int] = None):
        idx = self.epoch_indices(epoch)
        bs = self.batch_size
        return [idx[b * bs:(b + 1) * bs] for b in range(self.num_batches)]

    def aug_rng(self, epoch: int, batch: int) -> np.random.Generator:
        return np.random.default_rng([_AUG_TAG, self.seed, int(epoch), self.rank, int(batch)])

    def _require_epoch(self) -> int:
        if self.epoch is None:
            raise RuntimeError("BatchLoader(train=True): call set_epoch(epoch) before iterating")
        return self.epoch

    # ----------------------------------------------------------------- batches
    def make_batch(self, indices: np.ndarray, epoch: int, batch: int
                   ) -> Tuple[np.ndarray, np.ndarray]:
        images = self.dataset.get_images(indices)
        if self.train and (self.pad > 0 or self.hflip):
            ys, xs, flips = sample_crop_flip(self.aug_rng(epoch, batch), len(images), self.pad,
                                             self.hflip)
            images = crop_flip(images, self.pad, ys, xs, flips)
        x = normalize(images, self.mean, self.std)
        y = np.ascontiguousarray(self.dataset.labels[indices], dtype=np.int32)
        return x, y

    def _produce(self, epoch: int):
        for b, idx in enumerate(self.batch_indices(epoch)):
            yield self.make_batch(idx, epoch, b)

    def __iter__(self) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
        epoch = self._require_epoch() if self.train else (self.epoch or 0)
        if not self.prefetch or self.num_batches <= 1:
            return self._produce(epoch)
        return self._prefetched(epoch)

    def _prefetched(self, epoch: int):
        q: "queue.Queue" = queue.Queue(maxsize=1)
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
                for item in self._produce(epoch):
                    if not put(item):
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
