"""ImageFolder: ``root/{train,val}/<class>/**/*.{jpg,jpeg,png,webp,bmp}``, decoded per sample with cv2.

Labels are positions in one class list for both splits: ``data.classes`` when set, else the training
split's class folder names, sorted; a val folder maps to the training label of the same name, and a
val (or train) folder missing from that list is an error. ``channels`` None: 3 when any of up to 1000
training images spread over the list has a colour header, else 1 (logged); every image is decoded to
it (grey, RGBA, CMYK, 16-bit all handled by cv2, alpha dropped, EXIF orientation applied). The val split's
files are checked for truncation before anything trains (``check_files``). Unreadable directories and
images are errors naming them, or with ``skip_bad_images`` left out and counted in one warning.
"""

import os
from concurrent.futures import ThreadPoolExecutor
from typing import List, Optional, Sequence, Set

import cv2
import numpy as np
from loguru import logger

from .base import Dataset, _as_indices
from .errors import DataError
from .folder_scan import IMAGE_EXTENSIONS, FolderScan, folder_cache_dir, scan_split
from .image_files import decode_image, file_problem, is_colour_image

__all__ = ["ImageFolder", "IMAGE_EXTENSIONS", "decode_image", "scan_split", "folder_cache_dir"]

DEFAULT_IMAGE_SIZE = 224
# Generic defaults (ImageNet statistics); set data.mean / data.std for your data.
_MEAN = {3: (123.675, 116.28, 103.53), 1: (118.0,)}
_STD = {3: (58.395, 57.12, 57.375), 1: (58.0,)}
_CHANNEL_PROBES = 1000   # image headers read to choose the channel count
_CHECK_THREADS = 8       # files checked at once (I/O bound)
_SHOWN = 3               # examples named in a message
_SAID: Set[str] = set()  # info lines already logged by this process


def _examples(items: Sequence[str]) -> str:
    more = f" (and {len(items) - _SHOWN} more)" if len(items) > _SHOWN else ""
    return ", ".join(items[:_SHOWN]) + more


def _split_dir(root: str, train: bool) -> str:
    splits = ("train",) if train else ("val", "test")
    found = next((os.path.join(root, s) for s in splits if os.path.isdir(os.path.join(root, s))), None)
    if found is None:
        raise DataError(f"imagefolder: no {' or '.join(splits)} directory in {root}; expected "
                        f"{root}/{splits[0]}/<class_name>/*.jpg|png|webp|bmp. Set data.root to "
                        f"the directory holding train/ and val/.")
    return found


def _report_folders(scan: FolderScan, split_dir: str, skip_bad_images: bool) -> None:
    """Links not followed: a warning; unreadable directories: a DataError, or a warning with skip_bad_images."""
    if scan.skipped:
        logger.warning(f"imagefolder: {len(scan.skipped)} directory link(s) in {split_dir} not followed: they "
                       f"lead to a directory already scanned (a loop or a duplicate): {_examples(scan.skipped)}")
    if not scan.unreadable:
        return
    if not skip_bad_images:
        raise DataError(f"imagefolder: cannot read directory {scan.unreadable[0]}; fix its permissions or remove "
                        f"it, or set data.skip_bad_images=True to go on without it")
    logger.warning(f"imagefolder: {len(scan.unreadable)} unreadable directory(ies) in {split_dir} left out "
                   f"(data.skip_bad_images=True): {_examples(scan.unreadable)}")


def _check_classes(classes) -> List[str]:
    names = list(classes)
    if not names or not all(isinstance(c, str) and c for c in names) or len(set(names)) != len(names):
        raise DataError(f"data.classes must be a list of distinct, non-empty class folder names, got {classes!r}")
    return names


def _say_once(message: str) -> None:
    """Log ``message`` (info) the first time in this process: the train, val and precise-BN splits decide alike."""
    if message not in _SAID:
        _SAID.add(message)
        logger.info(message)


def _decide_channels(paths: List[str], where: str) -> int:
    """3 if any of up to _CHANNEL_PROBES files spread over ``paths`` has a colour header, else 1 (logged)."""
    picks = np.unique(np.linspace(0, len(paths) - 1, min(len(paths), _CHANNEL_PROBES)).astype(np.int64))
    grey = 0
    for i in picks:
        colour = is_colour_image(paths[int(i)])
        if colour:
            _say_once(f"imagefolder: 3 input channels: {paths[int(i)]} is a colour image (grey images are "
                      f"converted to RGB; set data.channels to choose)")
            return 3
        grey += colour is False
    if grey == 0:
        return 3
    _say_once(f"imagefolder: 1 input channel: the {grey} images checked of {where} ({len(picks)} of "
              f"{len(paths)}, spread over the list) are grey (colour images would be converted to grey; "
              f"set data.channels to choose)")
    return 1


class ImageFolder(Dataset):
    """Images in ROOT/{train,val}/CLASS/**/*.{jpg,png,webp,bmp}; labels index one class list (module doc).

    ``image_shape`` is (channels, image_size, image_size): what the loader's transforms crop to
    (default 224). ``classes``: the label order (default: the training class folders, sorted).
    ``check_files`` (default: for val/test, not train) checks every file for truncation now.
    """
    name = "imagefolder"
    decodes_per_sample = True
    exact_num_classes = True  # the class list is the model's output layer: num_classes must match it

    def __init__(self, root: str, train: bool = True, image_size: Optional[int] = None,
                 channels: Optional[int] = None, classes: Optional[Sequence[str]] = None,
                 skip_bad_images: bool = False, check_files: Optional[bool] = None):
        if not root:
            raise DataError("imagefolder needs data.root=<dir with train/ and val/ "
                            "sub-directories of class folders>")
        split_dir = _split_dir(root, train)
        self.root = root
        self.split = os.path.basename(split_dir)
        scan = scan_split(split_dir)
        _report_folders(scan, split_dir, skip_bad_images)
        if not scan.classes:
            raise DataError(f"imagefolder: {split_dir} has no class sub-directories; expected "
                            f"{split_dir}/<class_name>/*.jpg")
        train_dir = os.path.join(root, "train")
        reference = scan if train else (scan_split(train_dir) if os.path.isdir(train_dir) else None)
        self.classes = self._class_list(classes, reference, scan, split_dir)
        index = {c: i for i, c in enumerate(self.classes)}
        unknown = [c for c in scan.classes if c not in index]
        if unknown:
            source = "data.classes" if classes is not None else f"the training classes (class folders of {train_dir})"
            raise DataError(f"imagefolder: class folder {os.path.join(split_dir, unknown[0])} is not among "
                            f"{source}: {_examples(self.classes)}; rename or remove it, or list every class in "
                            f"data.classes")
        to_label = np.array([index[c] for c in scan.classes], np.int32)
        self.paths = list(scan.paths)
        self.labels = to_label[scan.labels] if len(scan.labels) else np.zeros(0, np.int32)
        if not self.paths:
            raise DataError(f"imagefolder: no {'/'.join(IMAGE_EXTENSIONS)} images under "
                            f"{split_dir}/<class_name>/")
        self._report_empty(scan, split_dir, train)
        if check_files if check_files is not None else not train:
            self._check_files(split_dir, skip_bad_images)
        self.num_classes = len(self.classes)
        if channels is None:
            use_train = not train and reference is not None and reference.paths
            channels = _decide_channels(*((reference.paths, train_dir) if use_train else (self.paths, split_dir)))
        if channels not in (1, 3):
            raise DataError(f"imagefolder: data.channels must be 1 or 3, got {channels}")
        self.channels = int(channels)
        size = DEFAULT_IMAGE_SIZE if image_size is None else int(image_size)
        self.image_shape = (self.channels, size, size)
        self.mean, self.std = _MEAN[self.channels], _STD[self.channels]
        self.default_pad = 4
        self.default_hflip = True

    def _class_list(self, classes, reference: Optional[FolderScan], scan: FolderScan, split_dir: str) -> List[str]:
        if classes is not None:
            return _check_classes(classes)
        if reference is not None:
            return list(reference.classes)
        logger.warning(f"imagefolder: no train/ beside {split_dir}: labels follow its own class folders, sorted; "
                       f"they are right only if training used exactly these classes (else set data.classes)")
        return list(scan.classes)

    def _report_empty(self, scan: FolderScan, split_dir: str, train: bool) -> None:
        counts = np.bincount(self.labels, minlength=len(self.classes))
        # train: every class of the list needs images; val: only its own folders are expected to have some
        names = self.classes if train else scan.classes
        empty = [c for c in names if counts[self.classes.index(c)] == 0]
        if empty:
            logger.warning(f"imagefolder: {len(empty)} class(es) with no images in {split_dir}: {_examples(empty)}"
                           + ("; they keep their labels (the model has outputs for them)" if train else ""))

    def _check_files(self, split_dir: str, skip_bad_images: bool) -> None:
        """Every file read at its ends (truncation, empty, not an image); bad ones: error, or left out."""
        with ThreadPoolExecutor(_CHECK_THREADS) as pool:
            problems = list(pool.map(file_problem, self.paths))
        bad = [f"{p}: {why}" for p, why in zip(self.paths, problems) if why]
        if not bad:
            return
        if not skip_bad_images:
            raise DataError(f"imagefolder: bad image {bad[0]}" + (f" ({len(bad)} bad in {split_dir})" if len(bad) > 1
                            else "") + "; delete or replace it, or set data.skip_bad_images=True to leave it out")
        keep = [i for i, why in enumerate(problems) if not why]
        self.paths = [self.paths[i] for i in keep]
        self.labels = self.labels[keep]
        logger.warning(f"imagefolder: {len(bad)} bad image(s) in {split_dir} left out (data.skip_bad_images=True): "
                       f"{_examples(bad)}")
        if not self.paths:
            raise DataError(f"imagefolder: no readable image left in {split_dir}")

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
