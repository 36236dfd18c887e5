"""Build datasets and loaders from the ``data`` config section, and check them against a model.

``data_cfg`` is dict-like (a basecore ConfigDict, a dict, or any object with attributes):

    name               "synthetic" | "fashion_mnist" | "mnist" | "cifar10" | "cifar100" |
                       "imagefolder"
    root               dataset directory (None: the dataset's default, where it has one)
    image_size         None (native size) or int (square resize; synthetic renders at it,
                       default 16)
    channels           None (the dataset's own) or 1 / 3 (converted)
    pad                random-crop zero padding (None: the dataset's default, 4 for most)
    hflip              random horizontal flips (None: the dataset's default; False for mnist)
    mean, std          per-channel normalisation in 0-255 units (None: dataset defaults)
    prefetch           prepare the next batch in a background thread (default True)
    train_size, test_size          synthetic only (default 6000 / 1000)
    seed               synthetic only: generation seed (default 0)
    max_train_samples, max_test_samples   use a fixed subset (None: all)
"""

from typing import Any, Optional

import numpy as np

from .base import Adapted, Dataset, Subset
from .cifar import CIFAR10, CIFAR100
from .errors import DataError
from .idx import MNIST, FashionMNIST
from .image_folder import ImageFolder
from .loader import BatchLoader
from .synthetic import SyntheticShapes

__all__ = ["DATASET_NAMES", "DATASET_ALIASES", "build_dataset", "build_loader", "validate_dataset"]

DATASET_NAMES = ("synthetic", "fashion_mnist", "mnist", "cifar10", "cifar100", "imagefolder")
DATASET_ALIASES = {"fashion-mnist": "fashion_mnist", "fashionmnist": "fashion_mnist",
            "cifar-10": "cifar10", "cifar-100": "cifar100", "image_folder": "imagefolder"}


def _get(cfg: Any, key: str, default=None):
    if cfg is None:
        return default
    if hasattr(cfg, "get"):
        value = cfg.get(key, default)
    else:
        value = getattr(cfg, key, default)
    return default if value is None else value


def _opt_int(cfg, key):
    v = _get(cfg, key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise DataError(f"data.{key} must be an integer or None, got {v!r}")
    return int(v)


def build_dataset(data_cfg, train: bool) -> Dataset:
    """The train (``train=True``) or test/val split described by ``data_cfg``."""
    raw_name = str(_get(data_cfg, "name", "synthetic"))
    name = DATASET_ALIASES.get(raw_name.lower(), raw_name.lower())
    if name not in DATASET_NAMES:
        raise DataError(f"unknown dataset data.name={raw_name!r}; valid names: "
                        f"{', '.join(DATASET_NAMES)}")
    root = _get(data_cfg, "root")
    image_size = _opt_int(data_cfg, "image_size")
    channels = _opt_int(data_cfg, "channels")
    if channels is not None and channels not in (1, 3):
        raise DataError(f"data.channels must be 1, 3 or None, got {channels}")
    if image_size is not None and image_size < 1:
        raise DataError(f"data.image_size must be positive, got {image_size}")

    if name == "synthetic":
        size = _opt_int(data_cfg, "train_size" if train else "test_size")
        ds: Dataset = SyntheticShapes(train=train, image_size=image_size or 16, size=size,
                                      seed=_opt_int(data_cfg, "seed") or 0)
        image_size = None  # rendered at the requested size
    elif name == "fashion_mnist":
        ds = FashionMNIST(root, train=train)
    elif name == "mnist":
        ds = MNIST(root, train=train)
    elif name == "cifar10":
        ds = CIFAR10(root, train=train)
    elif name == "cifar100":
        ds = CIFAR100(root, train=train)
    else:
        ds = ImageFolder(root, train=train, image_size=image_size, channels=channels)
        image_size = channels = None  # handled while decoding

    c, h, w = ds.image_shape
    if (channels is not None and channels != c) or (image_size is not None
                                                    and (image_size, image_size) != (h, w)):
        ds = Adapted(ds, channels=channels, image_size=image_size)
    return Subset.first_n(ds, _opt_int(data_cfg, "max_train_samples" if train
                                       else "max_test_samples"))


def build_loader(data_cfg, dataset: Dataset, batch_size: int, train: bool, seed: int = 0,
                 rank: int = 0, world_size: int = 1,
                 prefetch: Optional[bool] = None) -> BatchLoader:
    """A BatchLoader for ``dataset`` with the augmentation / normalisation from ``data_cfg``.

    ``pad`` / ``hflip`` None take the dataset's defaults; ``prefetch`` None takes
    ``data_cfg.prefetch`` (default True).
    """
    pad = _get(data_cfg, "pad")
    hflip = _get(data_cfg, "hflip")
    if prefetch is None:
        prefetch = bool(_get(data_cfg, "prefetch", True))
    return BatchLoader(
        dataset, batch_size, train=train, seed=seed, rank=rank, world_size=world_size,
        pad=dataset.default_pad if pad is None else int(pad),
        hflip=dataset.default_hflip if hflip is None else bool(hflip),
        mean=_get(data_cfg, "mean"), std=_get(data_cfg, "std"), prefetch=prefetch)


def validate_dataset(dataset: Dataset, num_classes: int, in_channels: Optional[int] = None,
                     image_size: Optional[int] = None) -> None:
    """Raise DataError if ``dataset`` cannot train/evaluate a model with these settings."""
    split = getattr(dataset, "split", None)
    name = f"dataset {dataset.name}" + (f" ({split} split)" if split else "")
    n = len(dataset)
    if n == 0:
        raise DataError(f"{name} is empty; check data.root and max_*_samples")
    labels = np.asarray(dataset.labels)
    lo, hi = int(labels.min()), int(labels.max())
    if lo < 0:
        raise DataError(f"{name} has negative label {lo}; labels must be 0..num_classes-1")
    need = max(int(dataset.num_classes), hi + 1)
    if need > num_classes:
        what = (f"has {dataset.num_classes} classes" if dataset.num_classes >= hi + 1
                else f"has labels up to {hi}")
        raise DataError(f"{name} {what} but num_classes={num_classes}; set num_classes={need}")
    c, h, w = dataset.image_shape
    if in_channels is not None and c != in_channels:
        raise DataError(f"{name} has {c}-channel images but the model expects in_channels="
                        f"{in_channels}; set data.channels={in_channels} to convert the images, "
                        f"or build the model with in_channels={c}")
    if image_size is not None:
        want = (image_size, image_size) if np.isscalar(image_size) else tuple(image_size)
        if (h, w) != want:
            raise DataError(f"{name} has {h}x{w} images but the model expects "
                            f"{want[0]}x{want[1]}; set data.image_size={want[0]} to resize "
                            f"them, or build the model for {h}x{w} inputs")
