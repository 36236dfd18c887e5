"""CIFAR-10 / CIFAR-100 from the official "python version" pickled batches.

Layouts (``root`` may be the batch directory itself or its parent)::

    cifar-10-batches-py/{data_batch_1..5, test_batch}    labels under b"labels"
    cifar-100-python/{train, test}                       labels under b"fine_labels"

Each batch is a pickle with ``b"data"`` (N, 3072) uint8 in CHW order and a label list.

Security note: unpickling runs code embedded in the file. This is the official format of
the distribution, but only load copies you trust (e.g. the tarball from
https://www.cs.toronto.edu/~kriz/cifar.html with a verified checksum).
"""

import os
import pickle
from typing import List, Optional

import numpy as np

from .base import ArrayDataset
from .errors import DataError

__all__ = ["CIFAR10", "CIFAR100", "read_cifar_batch", "write_cifar_batch"]


def read_cifar_batch(path: str, label_key: bytes):
    """Return (images uint8 (N, 32, 32, 3) HWC, labels int64 (N,)) from one pickled batch."""
    try:
        with open(path, "rb") as f:
            d = pickle.load(f, encoding="bytes")  # trusted official format: see module docstring
    except FileNotFoundError as e:
        raise DataError(f"CIFAR batch {path} not found") from e
    except Exception as e:  # corrupt pickle: UnpicklingError, EOFError, ValueError, ...
        raise DataError(f"cannot read CIFAR batch {path}: {type(e).__name__}: {e}. The file is "
                        f"corrupt; re-download and re-extract the dataset.") from e
    if not isinstance(d, dict) or b"data" not in d or label_key not in d:
        keys = sorted(d.keys()) if isinstance(d, dict) else type(d).__name__
        raise DataError(f"CIFAR batch {path} lacks b'data' or {label_key!r} (has {keys}); is "
                        f"this the right dataset (cifar10 vs cifar100) and the python version?")
    data = np.asarray(d[b"data"])
    labels = np.asarray(d[label_key], dtype=np.int64).reshape(-1)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise DataError(f"CIFAR batch {path}: data is {data.dtype} {data.shape}, expected uint8 "
                        f"(N, 3072); re-download the dataset.")
    if len(data) != len(labels):
        raise DataError(f"CIFAR batch {path}: {len(data)} images but {len(labels)} labels; "
                        f"re-download the dataset.")
    images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(images), labels


def write_cifar_batch(path: str, images_hwc: np.ndarray, labels, label_key: bytes = b"labels"):
    """Write a batch in the official layout (used by tests and to make tiny fixtures)."""
    images_hwc = np.asarray(images_hwc, np.uint8)
    data = images_hwc.transpose(0, 3, 1, 2).reshape(len(images_hwc), -1)
    with open(path, "wb") as f:
        pickle.dump({b"data": data, label_key: [int(x) for x in labels]}, f)


class _CIFAR(ArrayDataset):
    NAME = ""
    SUBDIR = ""
    TRAIN_FILES: List[str] = []
    TEST_FILES: List[str] = []
    LABEL_KEY = b"labels"
    NUM_CLASSES = 10
    MEAN = (125.3, 123.0, 113.9)
    STD = (63.0, 62.1, 66.7)
    URL = ""

    def __init__(self, root: Optional[str] = None, train: bool = True):
        fix = (f"Fix: download {self.URL}, extract it, and set data.root=<dir containing "
               f"{self.SUBDIR}> (or the {self.SUBDIR} dir itself).")
        if not root:
            raise DataError(f"{self.NAME} has no default location; set data.root. {fix}")
        files = self.TRAIN_FILES if train else self.TEST_FILES
        batch_dir = None
        for d in (root, os.path.join(root, self.SUBDIR)):
            if os.path.isfile(os.path.join(d, files[0])):
                batch_dir = d
                break
        if batch_dir is None:
            where = "does not exist" if not os.path.isdir(root) else "does not contain them"
            raise DataError(f"{self.NAME}: looked for {', '.join(files)} in {root} and "
                            f"{os.path.join(root, self.SUBDIR)}; {root} {where}. {fix}")
        self.root = batch_dir
        imgs, labs = [], []
        for fn in files:
            p = os.path.join(batch_dir, fn)
            if not os.path.isfile(p):
                raise DataError(f"{self.NAME}: batch file {p} is missing (the extraction is "
                                f"incomplete). {fix}")
            x, y = read_cifar_batch(p, self.LABEL_KEY)
            if y.size and (y.min() < 0 or y.max() >= self.NUM_CLASSES):
                raise DataError(f"{self.NAME}: {p} has labels in [{y.min()}, {y.max()}], expected "
                                f"0..{self.NUM_CLASSES - 1}; is this {self.NAME}?")
            imgs.append(x)
            labs.append(y)
        images = np.concatenate(imgs) if len(imgs) > 1 else imgs[0]
        super().__init__(images, np.concatenate(labs), name=self.NAME,
                         num_classes=self.NUM_CLASSES, split="train" if train else "test",
                         mean=self.MEAN, std=self.STD, default_pad=4, default_hflip=True)


class CIFAR10(_CIFAR):
    """CIFAR-10 (50000 train / 10000 test, 32x32 RGB, 10 classes). ``root`` is required."""

    NAME = "cifar10"
    CLASS_NAMES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
    SUBDIR = "cifar-10-batches-py"
    TRAIN_FILES = [f"data_batch_{i}" for i in range(1, 6)]
    TEST_FILES = ["test_batch"]
    LABEL_KEY = b"labels"
    NUM_CLASSES = 10
    MEAN = (125.3, 123.0, 113.9)
    STD = (63.0, 62.1, 66.7)
    URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"


class CIFAR100(_CIFAR):
    """CIFAR-100 fine labels (50000 train / 10000 test, 32x32 RGB, 100 classes)."""

    NAME = "cifar100"
    SUBDIR = "cifar-100-python"
    TRAIN_FILES = ["train"]
    TEST_FILES = ["test"]
    LABEL_KEY = b"fine_labels"
    NUM_CLASSES = 100
    MEAN = (129.3, 124.1, 112.4)
    STD = (68.2, 65.4, 70.4)
    URL = "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"
