"""Build datasets and loaders from the ``data`` config section, and check them against a model.

``data_cfg`` is dict-like (a ConfigDict, a dict, or an object with attributes); every key is
documented in basebn/config/defaults.py. The dataset's defaults fill train_crop ("random_resized"
for image folders, "pad" otherwise), pad and hflip before the builders of basebn.data.augment see
the config. Image folders, and in-memory data with per-image train ops (RandomResizedCrop,
ColorJitter, AutoAugment/RandAugment), are built sample by sample with ``build_sample_transform``;
other in-memory data keeps the vectorised pad-crop/flip plus ``build_batch_augment``;
``build_mixer`` (Mixup/CutMix) runs on each assembled train batch.
"""

from typing import Any, Optional

import numpy as np

from .augment import build_batch_augment, build_mixer, build_sample_transform
from .base import Adapted, Dataset, Subset
from .cifar import CIFAR10, CIFAR100
from .errors import DataError
from .idx import MNIST, FashionMNIST
from .image_folder import ImageFolder
from .loader import BatchLoader
from .synthetic import SyntheticShapes
from .transforms import resolve_stats
from .workers import default_num_workers

__all__ = ["DATASET_NAMES", "DATASET_ALIASES", "build_dataset", "build_loader", "validate_dataset",
           "resolve_num_workers", "uses_per_sample_transform"]

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
        ds = ImageFolder(root, train=train, image_size=image_size, channels=channels,
                         classes=_get(data_cfg, "classes"), skip_bad_images=bool(_get(data_cfg, "skip_bad_images")))
        image_size = channels = None  # handled while decoding

    c, h, w = ds.image_shape
    if (channels is not None and channels != c) or (image_size is not None
                                                    and (image_size, image_size) != (h, w)):
        ds = Adapted(ds, channels=channels, image_size=image_size)
    return Subset.first_n(ds, _opt_int(data_cfg, "max_train_samples" if train
                                       else "max_test_samples"))


def _resolved(data_cfg, dataset: Dataset) -> dict:
    """``data_cfg`` as a dict with the dataset defaults filled in (train_crop, pad, hflip)."""
    if data_cfg is None:
        cfg = {}
    elif hasattr(data_cfg, "items"):
        cfg = dict(data_cfg.items())
    else:
        cfg = dict(vars(data_cfg))
    if cfg.get("train_crop") is None:
        cfg["train_crop"] = "random_resized" if dataset.decodes_per_sample else "pad"
    if cfg.get("pad") is None:
        cfg["pad"] = dataset.default_pad
    if cfg.get("hflip") is None:
        cfg["hflip"] = dataset.default_hflip
    return cfg


def uses_per_sample_transform(cfg: dict, dataset: Dataset, train: bool) -> bool:
    """Whether batches are built sample by sample (decoded folders, or per-image train ops)."""
    if dataset.decodes_per_sample:
        return True
    return train and (cfg["train_crop"] != "pad" or bool(cfg.get("color_jitter"))
                      or bool(cfg.get("auto_augment")))


def resolve_num_workers(data_cfg, per_sample: bool) -> int:
    """``data.num_workers``; None = the CPUs available (at most 8) when samples are decoded one by
    one, else 0 (in-memory batches are one vectorised gather; workers would only add copies)."""
    n = _opt_int(data_cfg, "num_workers")
    if n is None:
        return default_num_workers() if per_sample else 0
    if n < 0:
        raise DataError(f"data.num_workers must be >= 0 (0 = load in the training process), got {n}")
    return n


def build_loader(data_cfg, dataset: Dataset, batch_size: int, train: bool, seed: int = 0,
                 rank: int = 0, world_size: int = 1, prefetch=None, num_classes: Optional[int] = None,
                 label_smoothing: float = 0.0, num_workers: Optional[int] = None) -> BatchLoader:
    """A BatchLoader for ``dataset`` with the workers, augmentation and normalisation of ``data_cfg``.

    ``prefetch`` / ``num_workers`` None take ``data.prefetch`` (None: 2) / ``data.num_workers``;
    ``num_classes`` (default: the dataset's) and ``label_smoothing`` shape Mixup/CutMix targets.
    """
    cfg = _resolved(data_cfg, dataset)
    mean, std = resolve_stats(dataset, cfg.get("mean"), cfg.get("std"))
    per_sample = uses_per_sample_transform(cfg, dataset, train)
    c, out_size, _ = dataset.image_shape
    sample_transform = (build_sample_transform(cfg, train, mean, std, out_size) if per_sample
                        else None)
    num_classes = int(num_classes or dataset.num_classes)
    return BatchLoader(
        dataset, batch_size, train=train, seed=seed, rank=rank, world_size=world_size,
        pad=int(cfg["pad"]), hflip=bool(cfg["hflip"]), mean=mean, std=std,
        prefetch=cfg.get("prefetch") if prefetch is None else prefetch,
        num_workers=resolve_num_workers(data_cfg, per_sample) if num_workers is None else num_workers,
        repeated_aug=int(cfg.get("repeated_aug") or 1),
        classes_per_batch=int(cfg.get("classes_per_batch") or 0), examples_per_class=cfg.get("examples_per_class"),
        sample_transform=sample_transform, image_shape=(c, out_size, out_size) if per_sample else None,
        batch_augment=None if per_sample or not train else build_batch_augment(cfg, mean, std),
        mixer=build_mixer(cfg, num_classes, label_smoothing) if train else None,
        num_classes=num_classes, skip_bad_images=bool(cfg.get("skip_bad_images", False)))


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
    if dataset.exact_num_classes and num_classes != dataset.num_classes:
        raise DataError(f"{name} has {dataset.num_classes} classes but num_classes={num_classes}; set "
                        f"num_classes={dataset.num_classes} (the classes are the training class folders, or "
                        f"data.classes when set)")
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
