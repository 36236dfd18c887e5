"""Per-image geometry on uint8 HWC arrays: RandomResizedCrop boxes, resizing, center crop, flip.

A box is ``(top, left, height, width)`` in pixels. ``sample_rrc_box`` is torchvision's
RandomResizedCrop algorithm (10 tries of area x log-uniform aspect, then a center crop clamped to
the ratio range), drawing only from the Generator it is given. Resizing is ``cv2.resize``; cv2's
bilinear/bicubic do not antialias when shrinking (torchvision tensors with antialias=False do the
same), "area" averages pixels and so does.
"""

import math
from typing import Sequence, Tuple

import cv2
import numpy as np

__all__ = ["INTERPOLATIONS", "sample_rrc_box", "center_rrc_box", "resize", "resized_crop",
           "resize_shorter", "center_crop", "hflip"]

# data.interpolation -> cv2 flag
INTERPOLATIONS = {"bilinear": cv2.INTER_LINEAR, "bicubic": cv2.INTER_CUBIC,
                  "area": cv2.INTER_AREA, "nearest": cv2.INTER_NEAREST}

Box = Tuple[int, int, int, int]


def center_rrc_box(height: int, width: int, ratio: Sequence[float]) -> Box:
    """RandomResizedCrop's fallback: the whole image, cut to the nearest allowed aspect ratio."""
    in_ratio = width / height
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def sample_rrc_box(height: int, width: int, scale: Sequence[float], ratio: Sequence[float],
                   rng: np.random.Generator, attempts: int = 10) -> Box:
    """A RandomResizedCrop box: area fraction uniform in ``scale``, aspect (w/h) log-uniform in ``ratio``."""
    area = height * width
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(attempts):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_lo, log_hi))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return top, left, h, w
    return center_rrc_box(height, width, ratio)


def resize(img: np.ndarray, height: int, width: int, interpolation: str = "bilinear") -> np.ndarray:
    """cv2.resize to (height, width), keeping the channel axis even for one channel."""
    if img.shape[0] == height and img.shape[1] == width:
        return img
    out = cv2.resize(img, (int(width), int(height)), interpolation=INTERPOLATIONS[interpolation])
    return out.reshape(height, width, img.shape[2])


def resized_crop(img: np.ndarray, box: Box, height: int, width: int,
                 interpolation: str = "bilinear") -> np.ndarray:
    """Crop ``box`` out of ``img`` and resize it to (height, width)."""
    top, left, h, w = box
    return resize(img[top:top + h, left:left + w], height, width, interpolation)


def resize_shorter(img: np.ndarray, size: int, interpolation: str = "bilinear") -> np.ndarray:
    """Resize so the shorter side is ``size``, keeping the aspect ratio (torchvision's Resize(int))."""
    h, w = img.shape[:2]
    if h <= w:
        return resize(img, size, int(size * w / h), interpolation)
    return resize(img, int(size * h / w), size, interpolation)


def center_crop(img: np.ndarray, size: int) -> np.ndarray:
    """The central size x size window (torchvision's rounding); zero-padded where the image is smaller."""
    h, w = img.shape[:2]
    if h < size or w < size:
        ph, pw = max(size - h, 0), max(size - w, 0)
        img = np.pad(img, ((ph // 2, ph - ph // 2), (pw // 2, pw - pw // 2), (0, 0)))
        h, w = img.shape[:2]
    top = int(round((h - size) / 2.0))
    left = int(round((w - size) / 2.0))
    return img[top:top + size, left:left + size]


def hflip(img: np.ndarray) -> np.ndarray:
    """Mirror along the width axis."""
    return img[:, ::-1]
