"""Datasets, batch augmentations and the sharded numpy batch loader."""

from .base import Adapted, ArrayDataset, Dataset, Subset, subset_indices
from .build import DATASET_ALIASES, DATASET_NAMES, build_dataset, build_loader, validate_dataset
from .cifar import CIFAR10, CIFAR100
from .errors import DataError
from .idx import MNIST, FashionMNIST, read_idx, write_idx
from .image_folder import ImageFolder
from .loader import BatchLoader
from .synthetic import SyntheticShapes
from .transforms import augment, crop_flip, normalize, random_crop, random_hflip, sample_crop_flip

__all__ = [
    "DataError", "Dataset", "ArrayDataset", "Subset", "Adapted", "subset_indices",
    "SyntheticShapes", "FashionMNIST", "MNIST", "CIFAR10", "CIFAR100", "ImageFolder",
    "read_idx", "write_idx", "BatchLoader", "DATASET_NAMES", "DATASET_ALIASES", "build_dataset", "build_loader",
    "validate_dataset", "augment", "crop_flip", "normalize", "random_crop", "random_hflip",
    "sample_crop_flip",
]
