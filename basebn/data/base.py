"""The small dataset interface shared by every dataset, plus generic wrappers.

A dataset exposes::

    len(ds)                 number of samples
    ds.name                 short name ("fashion_mnist", "cifar10", ...)
    ds.num_classes          int
    ds.labels               int32 array of shape (len(ds),)
    ds.image_shape          (C, H, W) of every image
    ds.get_images(indices)  uint8 array (n, H, W, C), HWC like images on disk
    ds.mean, ds.std         per-channel defaults for normalisation, 0-255 units
    ds.default_pad          default zero padding for random-crop augmentation
    ds.default_hflip        whether horizontal flips preserve labels
    ds.load(i)              one sample as uint8 (h, w, C), any size (per-sample pipelines)
    ds.decodes_per_sample   True when samples differ in size and go through ``load`` (folders)
    ds.exact_num_classes    True when num_classes must equal ds.num_classes (folders of named classes)
"""

from typing import Sequence, Tuple

import cv2
import numpy as np

from .errors import DataError

__all__ = ["Dataset", "ArrayDataset", "Subset", "Adapted", "subset_indices"]

# Seed of the fixed permutation behind ``max_samples`` subsets (independent of the run seed,
# so every run and every rank sees the same subset).
_SUBSET_SEED = 0x5B5E7


class Dataset:
    """Base class; subclasses set the attributes and implement ``get_images``."""

    name: str = "dataset"
    split: str = "train"
    num_classes: int = 0
    labels: np.ndarray
    image_shape: Tuple[int, int, int]
    mean: Tuple[float, ...] = (127.5,)
    std: Tuple[float, ...] = (64.0,)
    default_pad: int = 4
    default_hflip: bool = True
    decodes_per_sample: bool = False
    exact_num_classes: bool = False  # True: num_classes must equal the dataset's (its classes are named folders)

    def __len__(self) -> int:
        return int(len(self.labels))

    def get_images(self, indices) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def load(self, i: int) -> np.ndarray:
        """Sample ``i`` as uint8 (h, w, C); datasets of differently sized images override it."""
        return self.get_images([int(i)])[0]

    def __repr__(self) -> str:
        c, h, w = self.image_shape
        return (f"{type(self).__name__}(name={self.name!r}, split={self.split!r}, n={len(self)}, "
                f"classes={self.num_classes}, image={c}x{h}x{w})")


def _as_indices(indices, n: int) -> np.ndarray:
    idx = np.asarray(indices)
    if idx.dtype == bool:
        idx = np.flatnonzero(idx)
    idx = idx.astype(np.int64, copy=False).reshape(-1)
    if idx.size and (idx.min() < -n or idx.max() >= n):
        raise IndexError(f"index out of range for dataset of size {n}")
    return idx


class ArrayDataset(Dataset):
    """A dataset held in memory as a uint8 (N, H, W, C) array."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, *, name: str, num_classes: int,
                 split: str = "train", mean: Sequence[float] = None, std: Sequence[float] = None,
                 default_pad: int = 4, default_hflip: bool = True):
        images = np.asarray(images)
        if images.ndim == 3:
            images = images[..., None]
        if images.ndim != 4 or images.dtype != np.uint8:
            raise DataError(f"{name}: expected uint8 images (N, H, W, C), got {images.dtype} "
                            f"{images.shape}")
        labels = np.asarray(labels).astype(np.int32, copy=False).reshape(-1)
        if len(labels) != len(images):
            raise DataError(f"{name}: {len(images)} images but {len(labels)} labels")
        self.images = images
        self.labels = labels
        self.name = name
        self.split = split
        self.num_classes = int(num_classes)
        n, h, w, c = images.shape
        self.image_shape = (c, h, w)
        if mean is not None:
            self.mean = tuple(float(m) for m in mean)
        if std is not None:
            self.std = tuple(float(s) for s in std)
        self.default_pad = default_pad
        self.default_hflip = default_hflip

    def get_images(self, indices) -> np.ndarray:
        return self.images[_as_indices(indices, len(self))]


class _Wrapper(Dataset):
    """Forwards the interface to ``self.base``."""

    def __init__(self, base: Dataset):
        self.base = base
        self.name = base.name
        self.split = getattr(base, "split", "train")
        self.num_classes = base.num_classes
        self.labels = base.labels
        self.image_shape = tuple(base.image_shape)
        self.mean = tuple(base.mean)
        self.std = tuple(base.std)
        self.default_pad = base.default_pad
        self.default_hflip = base.default_hflip
        self.decodes_per_sample = base.decodes_per_sample
        self.exact_num_classes = base.exact_num_classes

    def get_images(self, indices) -> np.ndarray:
        return self.base.get_images(indices)


def subset_indices(n: int, max_samples) -> np.ndarray:
    """The first ``max_samples`` of a fixed permutation of ``range(n)``, sorted."""
    if max_samples is None or int(max_samples) >= n:
        return np.arange(n, dtype=np.int64)
    if int(max_samples) <= 0:
        raise DataError(f"max_samples must be positive or None, got {max_samples}")
    perm = np.random.default_rng(_SUBSET_SEED).permutation(n)
    return np.sort(perm[: int(max_samples)])


class Subset(_Wrapper):
    """A fixed subset of a dataset (``indices`` into the base dataset)."""

    def __init__(self, base: Dataset, indices):
        super().__init__(base)
        self.indices = _as_indices(indices, len(base))
        self.labels = base.labels[self.indices]

    @classmethod
    def first_n(cls, base: Dataset, max_samples) -> Dataset:
        """``base`` itself if ``max_samples`` is None or >= len(base), else a fixed subset."""
        if max_samples is None or int(max_samples) >= len(base):
            return base
        return cls(base, subset_indices(len(base), max_samples))

    def get_images(self, indices) -> np.ndarray:
        return self.base.get_images(self.indices[_as_indices(indices, len(self))])

    def load(self, i: int) -> np.ndarray:
        """Sample ``i`` of the subset, decoded by the base dataset."""
        return self.base.load(int(self.indices[int(i)]))


# ITU-R BT.601 luma weights, the ones cv2.COLOR_RGB2GRAY uses.
_LUMA = np.array([0.299, 0.587, 0.114])


class Adapted(_Wrapper):
    """Converts a dataset's images on the fly to ``channels`` (1 <-> 3) and/or a square size.

    1 -> 3 replicates the grey channel; 3 -> 1 takes the luma (images are RGB).
    Resizing uses ``cv2.INTER_AREA`` when shrinking and ``cv2.INTER_LINEAR`` when enlarging.
    """

    def __init__(self, base: Dataset, channels: int = None, image_size: int = None):
        super().__init__(base)
        c, h, w = base.image_shape
        self.channels = c if channels is None else int(channels)
        if (c, self.channels) not in ((1, 1), (3, 3), (1, 3), (3, 1)):
            raise DataError(f"dataset {base.name} has {c}-channel images; cannot convert to "
                            f"data.channels={channels} (supported: 1 or 3)")
        self.size = None if image_size is None else (int(image_size), int(image_size))
        oh, ow = self.size if self.size is not None else (h, w)
        self.image_shape = (self.channels, oh, ow)
        mean = np.broadcast_to(np.asarray(base.mean, dtype=np.float64), (c,))
        std = np.broadcast_to(np.asarray(base.std, dtype=np.float64), (c,))
        if c == 1 and self.channels == 3:
            mean, std = np.repeat(mean, 3), np.repeat(std, 3)
        elif c == 3 and self.channels == 1:
            mean, std = mean @ _LUMA[:, None], std @ _LUMA[:, None]  # approximation for std
        self.mean = tuple(float(m) for m in mean)
        self.std = tuple(float(s) for s in std)

        # In-memory bases are converted once (grey/resize), so epochs do not pay for it again.
        self._converted = None
        if isinstance(base, ArrayDataset) and (self.size is not None or self.channels < c):
            self._converted = self._convert(base.images)

    def _convert(self, x: np.ndarray) -> np.ndarray:
        """Grey conversion and resizing (channel replication is left to ``get_images``)."""
        if x.shape[-1] == 3 and self.channels == 1:
            x = np.rint(x @ _LUMA.astype(np.float32)).clip(0, 255).astype(np.uint8)[..., None]
        if self.size is not None and x.shape[1:3] != self.size:
            h, w = x.shape[1:3]
            oh, ow = self.size
            interp = cv2.INTER_AREA if oh * ow < h * w else cv2.INTER_LINEAR
            out = np.empty((len(x), oh, ow, x.shape[-1]), np.uint8)
            for i, im in enumerate(x):
                out[i] = cv2.resize(im, (ow, oh), interpolation=interp).reshape(oh, ow, -1)
            x = out
        return x

    def get_images(self, indices) -> np.ndarray:
        if self._converted is not None:
            x = self._converted[_as_indices(indices, len(self))]
        else:
            x = self._convert(self.base.get_images(indices))
        if x.shape[-1] == 1 and self.channels == 3:
            x = np.repeat(x, 3, axis=-1)
        return x
