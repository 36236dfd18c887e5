"""MNIST / Fashion-MNIST from IDX files (plain or gzipped), parsed with numpy.

IDX layout: 2 zero bytes, a dtype code, the number of dims, then one big-endian uint32
per dim, then the data (big-endian for multi-byte types).
"""

import gzip
import os
import zlib
from typing import Optional

import numpy as np

from .base import ArrayDataset
from .errors import DataError

__all__ = ["read_idx", "write_idx", "load_idx_pair", "FashionMNIST", "MNIST",
           "FASHION_MNIST_DEFAULT_ROOT"]

FASHION_MNIST_DEFAULT_ROOT = "/usr/share/datasets/fashion-mnist"  # Debian dataset-fashion-mnist

_IDX_DTYPES = {0x08: np.dtype("u1"), 0x09: np.dtype("i1"), 0x0B: np.dtype(">i2"),
               0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}
_CODES = {np.dtype(v).newbyteorder("="): k for k, v in _IDX_DTYPES.items()}


def _read_bytes(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            raw = f.read()
        if raw[:2] == b"\x1f\x8b":  # gzip magic, whatever the file is called
            raw = gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as e:
        raise DataError(f"cannot read IDX file {path}: {e}. The file is unreadable or corrupt; "
                        f"re-download or reinstall it.") from e
    return raw


def read_idx(path: str, expect_ndim: Optional[int] = None) -> np.ndarray:
    """Parse one IDX file (gzipped or not) into a native-endian numpy array."""
    raw = _read_bytes(path)
    if len(raw) < 4:
        raise DataError(f"IDX file {path} is truncated ({len(raw)} bytes); re-download it.")
    zero, code, ndim = int.from_bytes(raw[:2], "big"), raw[2], raw[3]
    if zero != 0 or code not in _IDX_DTYPES or ndim == 0:
        raise DataError(f"{path} is not an IDX file (bad magic number 0x{raw[:4].hex()}); "
                        f"expected 0x000008NN. Re-download it or point data.root elsewhere.")
    if expect_ndim is not None and ndim != expect_ndim:
        raise DataError(f"IDX file {path} has {ndim} dims, expected {expect_ndim} "
                        f"(magic 0x{raw[:4].hex()}); are the image and label files swapped?")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"IDX file {path} is truncated inside its header; re-download it.")
    dims = tuple(int(d) for d in np.frombuffer(raw, ">u4", ndim, 4))
    dtype = _IDX_DTYPES[code]
    count = int(np.prod(dims, dtype=np.int64))
    if len(raw) - header != count * dtype.itemsize:
        raise DataError(f"IDX file {path}: header says dims {dims} ({count * dtype.itemsize} data "
                        f"bytes) but the file has {len(raw) - header}; it is truncated or "
                        f"corrupt, re-download it.")
    arr = np.frombuffer(raw, dtype, count, header).reshape(dims)
    return arr.astype(dtype.newbyteorder("="), copy=False)


def write_idx(path: str, arr: np.ndarray, compress: Optional[bool] = None) -> None:
    """Write ``arr`` as an IDX file (gzipped if ``compress`` or the path ends in .gz)."""
    arr = np.asarray(arr)
    code = _CODES.get(arr.dtype.newbyteorder("="))
    if code is None:
        raise ValueError(f"dtype {arr.dtype} has no IDX code")
    data = (bytes([0, 0, code, arr.ndim]) + np.asarray(arr.shape, ">u4").tobytes()
            + arr.astype(_IDX_DTYPES[code], copy=False).tobytes())
    if compress if compress is not None else path.endswith(".gz"):
        data = gzip.compress(data, compresslevel=1)
    with open(path, "wb") as f:
        f.write(data)


def _find(root: str, stem: str, dataset: str, fix: str) -> str:
    alt = stem.replace("-idx", ".idx")  # some mirrors name them train-images.idx3-ubyte
    candidates = [stem, stem + ".gz", alt, alt + ".gz"]
    for c in candidates:
        p = os.path.join(root, c)
        if os.path.isfile(p):
            return p
    where = (f"directory {root} does not exist" if not os.path.isdir(root)
             else f"not found in {root}")
    raise DataError(f"{dataset}: looked for {stem}[.gz] (or {candidates[2]}[.gz]): {where}. "
                    f"{fix}")


def load_idx_pair(root: str, train: bool, dataset: str, fix: str):
    """Load (images uint8 (N, H, W), labels uint8 (N,)) for the train or t10k split."""
    prefix = "train" if train else "t10k"
    ipath = _find(root, f"{prefix}-images-idx3-ubyte", dataset, fix)
    lpath = _find(root, f"{prefix}-labels-idx1-ubyte", dataset, fix)
    images = read_idx(ipath, expect_ndim=3)
    labels = read_idx(lpath, expect_ndim=1)
    if images.dtype != np.uint8 or labels.dtype != np.uint8:
        raise DataError(f"{dataset}: expected unsigned-byte IDX files, got {images.dtype} in "
                        f"{ipath} and {labels.dtype} in {lpath}")
    if len(images) != len(labels):
        raise DataError(f"{dataset}: {ipath} has {len(images)} images but {lpath} has "
                        f"{len(labels)} labels; the files come from different copies, "
                        f"re-download both.")
    return images, labels, ipath, lpath


class _IDXDataset(ArrayDataset):
    NAME = ""
    MEAN = (127.5,)
    STD = (64.0,)
    PAD = 2
    HFLIP = False

    def __init__(self, root: str, train: bool, fix: str):
        self.root = root
        images, labels, self.image_path, self.label_path = load_idx_pair(root, train, self.NAME,
                                                                         fix)
        if labels.size and labels.max() >= 10:
            raise DataError(f"{self.NAME}: {self.label_path} has label {labels.max()}, expected "
                            f"0..9; the file is corrupt, re-download it.")
        super().__init__(images[..., None], labels, name=self.NAME, num_classes=10,
                         split="train" if train else "test", mean=self.MEAN, std=self.STD,
                         default_pad=self.PAD, default_hflip=self.HFLIP)


class FashionMNIST(_IDXDataset):
    """Fashion-MNIST (60000 train / 10000 test, 28x28 grey, 10 classes).

    ``root`` defaults to the Debian ``dataset-fashion-mnist`` install location.
    """

    NAME = "fashion_mnist"
    CLASS_NAMES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                   "Ankle boot")  # label order (the dataset's README)
    MEAN = (72.94,)
    STD = (90.02,)
    PAD = 4
    HFLIP = True  # clothing is left-right symmetric enough; the usual recipe flips

    def __init__(self, root: Optional[str] = None, train: bool = True):
        root = root or FASHION_MNIST_DEFAULT_ROOT
        fix = ("Fix: run `apt-get install dataset-fashion-mnist` (installs "
               f"{FASHION_MNIST_DEFAULT_ROOT}) or set data.root=<dir with the IDX files>.")
        super().__init__(root, train, fix)


class MNIST(_IDXDataset):
    """MNIST digits (60000 train / 10000 test, 28x28 grey, 10 classes). ``root`` is required."""

    NAME = "mnist"
    CLASS_NAMES = tuple(str(d) for d in range(10))
    MEAN = (33.32,)
    STD = (78.57,)
    PAD = 2
    HFLIP = False  # flipped digits are different digits

    def __init__(self, root: Optional[str] = None, train: bool = True):
        fix = ("Fix: download the four MNIST IDX files (train-images-idx3-ubyte.gz, "
               "train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz) "
               "into one directory and set data.root=<that dir>.")
        if not root:
            raise DataError(f"mnist has no default location; set data.root=<dir with the IDX "
                            f"files>. {fix}")
        super().__init__(root, train, fix)
