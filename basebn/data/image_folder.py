"""ImageFolder: ``root/{train,val}/<class>/**/*.{jpg,jpeg,png,webp,bmp}``, decoded per sample with cv2.

Classes are the split's sub-directory names, sorted; labels are their positions. ``load(i)``
decodes one image at its own size, converted to RGB (grey, RGBA, CMYK, 16-bit all handled by
cv2.IMREAD_COLOR, alpha dropped, EXIF orientation applied) or to grey with ``channels=1``; the
loader's per-sample transform crops it (aspect ratio kept). The file list is scanned once: kept
in memory per process and in ``$BASEBN_DATA_CACHE`` (default ~/.cache/basebn/imagefolder), one
JSON file per split directory, valid while no scanned directory's mtime has changed.
"""

import hashlib
import json
import os
from typing import Dict, List, Optional, Tuple

import cv2
import numpy as np

from ..utils.fs import atomic_write_bytes
from .base import Dataset, _as_indices
from .errors import DataError

__all__ = ["ImageFolder", "IMAGE_EXTENSIONS", "decode_image", "scan_split", "folder_cache_dir"]

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp")
DEFAULT_IMAGE_SIZE = 224
# Generic defaults (ImageNet statistics); set data.mean / data.std for your data.
_MEAN = {3: (123.675, 116.28, 103.53), 1: (118.0,)}
_STD = {3: (58.395, 57.12, 57.375), 1: (58.0,)}
_CACHE_VERSION = 1
_SCANNED: Dict[Tuple[str, tuple], tuple] = {}  # in-process: (split dir, dir mtimes) -> scan


def folder_cache_dir() -> str:
    """Where file lists are cached: ``$BASEBN_DATA_CACHE``, else ~/.cache/basebn/imagefolder."""
    return os.environ.get("BASEBN_DATA_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "basebn", "imagefolder")


def decode_image(path: str, channels: int) -> np.ndarray:
    """The image at ``path`` as uint8 (h, w, channels): RGB for 3, grey for 1."""
    try:
        buf = np.fromfile(path, dtype=np.uint8)
    except OSError as e:
        raise DataError(f"cannot read image {path}: {e.strerror or e}") from e
    flag = cv2.IMREAD_GRAYSCALE if channels == 1 else cv2.IMREAD_COLOR
    img = cv2.imdecode(buf, flag) if buf.size else None
    if img is None:
        raise DataError(f"cannot decode image {path}: not a valid image file (corrupt or "
                        f"truncated); delete or replace it")
    if channels == 3:
        return cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
    return img.reshape(img.shape[0], img.shape[1], 1)


def _walk(class_dir: str):
    """(sorted relative image paths, {directory: mtime_ns}) under ``class_dir``, links followed."""
    files, mtimes = [], {}
    for dirpath, dirnames, filenames in os.walk(class_dir, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        mtimes[dirpath] = os.stat(dirpath).st_mtime_ns
        files += [os.path.join(dirpath, f) for f in sorted(filenames)
                  if f.lower().endswith(IMAGE_EXTENSIONS) and not f.startswith(".")]
    return files, mtimes


def _still_valid(mtimes: Dict[str, int]) -> bool:
    try:
        return all(os.stat(d).st_mtime_ns == t for d, t in mtimes.items())
    except OSError:
        return False


def scan_split(split_dir: str) -> Tuple[List[str], List[str], np.ndarray]:
    """(classes, image paths, int32 labels) of ``split_dir``, from a cache when still valid."""
    split_dir = os.path.abspath(split_dir)
    key = hashlib.sha1(split_dir.encode()).hexdigest()[:20]
    cache_file = os.path.join(folder_cache_dir(), f"{key}.json")
    for cached in _cached_scans(split_dir, cache_file):
        if cached.get("version") == _CACHE_VERSION and _still_valid(cached["mtimes"]):
            return cached["classes"], cached["paths"], np.asarray(cached["labels"], np.int32)
    mtimes = {split_dir: os.stat(split_dir).st_mtime_ns}
    classes = sorted(e.name for e in os.scandir(split_dir) if e.is_dir() and not e.name.startswith("."))
    paths, labels = [], []
    for label, cls in enumerate(classes):
        files, dirs = _walk(os.path.join(split_dir, cls))
        paths += files
        labels += [label] * len(files)
        mtimes.update(dirs)
    scan = dict(version=_CACHE_VERSION, classes=classes, paths=paths, labels=labels, mtimes=mtimes)
    _SCANNED[split_dir] = scan
    try:
        os.makedirs(os.path.dirname(cache_file), exist_ok=True)
        atomic_write_bytes(cache_file, json.dumps(scan).encode())
    except OSError:  # an unwritable cache only costs a re-scan next time
        pass
    return classes, paths, np.asarray(labels, np.int32)


def _cached_scans(split_dir: str, cache_file: str):
    if split_dir in _SCANNED:
        yield _SCANNED[split_dir]
    try:
        with open(cache_file) as f:
            cached = json.load(f)
    except (OSError, ValueError):
        return
    if isinstance(cached, dict) and "mtimes" in cached:
        _SCANNED[split_dir] = cached
        yield cached


class ImageFolder(Dataset):
    """Images in ROOT/{train,val}/CLASS/*.{jpg,png,webp,bmp}; classes sorted by folder name.

    ``image_shape`` is (channels, image_size, image_size): what the loader's transforms crop to
    (default 224). ``channels`` None: 1 if the first image is grey, else 3.
    """
    name = "imagefolder"
    decodes_per_sample = True

    def __init__(self, root: str, train: bool = True, image_size: Optional[int] = None,
                 channels: Optional[int] = None):
        if not root:
            raise DataError("imagefolder needs data.root=<dir with train/ and val/ "
                            "sub-directories of class folders>")
        splits = ("train",) if train else ("val", "test")
        split_dir = next((os.path.join(root, s) for s in splits
                          if os.path.isdir(os.path.join(root, s))), None)
        if split_dir is None:
            raise DataError(f"imagefolder: no {' or '.join(splits)} directory in {root}; expected "
                            f"{root}/{splits[0]}/<class_name>/*.jpg|png|webp|bmp. Set data.root to "
                            f"the directory holding train/ and val/.")
        self.root = root
        self.split = os.path.basename(split_dir)
        self.classes, self.paths, self.labels = scan_split(split_dir)
        if not self.classes:
            raise DataError(f"imagefolder: {split_dir} has no class sub-directories; expected "
                            f"{split_dir}/<class_name>/*.jpg")
        if not self.paths:
            raise DataError(f"imagefolder: no {'/'.join(IMAGE_EXTENSIONS)} images under "
                            f"{split_dir}/<class_name>/")
        self.num_classes = len(self.classes)
        if channels is None:
            first = cv2.imread(self.paths[0], cv2.IMREAD_UNCHANGED)
            channels = 1 if first is not None and first.ndim == 2 else 3
        if channels not in (1, 3):
            raise DataError(f"imagefolder: data.channels must be 1 or 3, got {channels}")
        self.channels = int(channels)
        size = DEFAULT_IMAGE_SIZE if image_size is None else int(image_size)
        self.image_shape = (self.channels, size, size)
        self.mean, self.std = _MEAN[self.channels], _STD[self.channels]
        self.default_pad = 4
        self.default_hflip = True

    def load(self, i: int) -> np.ndarray:
        """Decode sample ``i`` at its own size to uint8 (h, w, C)."""
        return decode_image(self.paths[int(i)], self.channels)

    def get_images(self, indices) -> np.ndarray:
        """Samples resized (shorter side to image_size, aspect kept) and center-cropped, uint8 NHWC."""
        idx = _as_indices(indices, len(self))
        c, size, _ = self.image_shape
        out = np.empty((len(idx), size, size, c), np.uint8)
        for j, i in enumerate(idx):
            img = self.load(int(i))
            h, w = img.shape[:2]
            scale = size / min(h, w)
            nh, nw = max(size, round(h * scale)), max(size, round(w * scale))
            interp = cv2.INTER_AREA if scale < 1 else cv2.INTER_LINEAR
            img = cv2.resize(img, (nw, nh), interpolation=interp).reshape(nh, nw, c)
            top, left = (nh - size) // 2, (nw - size) // 2
            out[j] = img[top:top + size, left:left + size]
        return out
