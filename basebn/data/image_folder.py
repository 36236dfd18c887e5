"""ImageFolder: ``root/{train,val}/<class_name>/*.{png,jpg,jpeg,bmp}``, decoded lazily with cv2.

Classes are the sub-directory names of the split, sorted; labels are their positions.
Images are decoded on demand (RGB, or grey with ``channels=1``) and resized to a square
``image_size`` if given; otherwise every image must have the size of the first one.
"""

import os
from typing import Optional

import cv2
import numpy as np

from .base import Dataset, _as_indices
from .errors import DataError

__all__ = ["ImageFolder", "IMAGE_EXTENSIONS"]

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp")
# Generic defaults (ImageNet statistics); set data.mean / data.std for your data.
_MEAN = {3: (123.675, 116.28, 103.53), 1: (118.0,)}
_STD = {3: (58.395, 57.12, 57.375), 1: (58.0,)}


def _decode(path: str, flag: int) -> np.ndarray:
    try:
        buf = np.fromfile(path, dtype=np.uint8)
    except OSError as e:
        raise DataError(f"cannot read image {path}: {e}") from e
    img = cv2.imdecode(buf, flag) if buf.size else None
    if img is None:
        raise DataError(f"cannot decode image {path}: not a valid image file (corrupt or "
                        f"truncated); delete or replace it.")
    return img


class ImageFolder(Dataset):
    """Images in ROOT/{train,val}/CLASS/*.{jpg,png,...}; classes sorted by folder name."""
    name = "imagefolder"

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
                            f"{root}/{splits[0]}/<class_name>/*.png|jpg|jpeg|bmp. Set data.root to "
                            f"the directory holding train/ and val/.")
        self.root = root
        self.split = os.path.basename(split_dir)
        self.classes = sorted(e.name for e in os.scandir(split_dir)
                              if e.is_dir() and not e.name.startswith("."))
        if not self.classes:
            raise DataError(f"imagefolder: {split_dir} has no class sub-directories; expected "
                            f"{split_dir}/<class_name>/*.png")
        paths, labels = [], []
        for label, cls in enumerate(self.classes):
            cdir = os.path.join(split_dir, cls)
            files = sorted(f for f in os.listdir(cdir)
                           if f.lower().endswith(IMAGE_EXTENSIONS) and not f.startswith("."))
            paths += [os.path.join(cdir, f) for f in files]
            labels += [label] * len(files)
        if not paths:
            raise DataError(f"imagefolder: no {'/'.join(IMAGE_EXTENSIONS)} images under "
                            f"{split_dir}/<class_name>/")
        self.paths = paths
        self.labels = np.asarray(labels, np.int32)
        self.num_classes = len(self.classes)

        first = _decode(paths[0], cv2.IMREAD_UNCHANGED)
        if channels is None:
            channels = 1 if first.ndim == 2 else 3
        if channels not in (1, 3):
            raise DataError(f"imagefolder: data.channels must be 1 or 3, got {channels}")
        self.channels = int(channels)
        self._flag = cv2.IMREAD_GRAYSCALE if channels == 1 else cv2.IMREAD_COLOR
        if image_size is not None:
            self.size = (int(image_size), int(image_size))
        else:
            self.size = tuple(first.shape[:2])
        self._resize = image_size is not None
        self.image_shape = (self.channels,) + self.size
        self.mean, self.std = _MEAN[self.channels], _STD[self.channels]
        self.default_pad = 4
        self.default_hflip = True

    def load(self, i: int) -> np.ndarray:
        """Decode sample ``i`` to uint8 (H, W, C)."""
        path = self.paths[i]
        img = _decode(path, self._flag)
        h, w = self.size
        if self._resize:
            if img.shape[:2] != (h, w):
                interp = cv2.INTER_AREA if h * w < img.shape[0] * img.shape[1] else cv2.INTER_LINEAR
                img = cv2.resize(img, (w, h), interpolation=interp)
        elif img.shape[:2] != (h, w):
            raise DataError(f"imagefolder: {path} is {img.shape[1]}x{img.shape[0]} (WxH) but "
                            f"{self.paths[0]} is {w}x{h}; set data.image_size=<N> to resize all "
                            f"images to NxN, or make them the same size.")
        if self.channels == 3:
            img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
        return img.reshape(h, w, self.channels)

    def get_images(self, indices) -> np.ndarray:
        idx = _as_indices(indices, len(self))
        out = np.empty((len(idx),) + self.size + (self.channels,), np.uint8)
        for j, i in enumerate(idx):
            out[j] = self.load(int(i))
        return out
