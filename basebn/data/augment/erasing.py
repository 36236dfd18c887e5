"""Random erasing (Zhong et al.) on normalised CHW float arrays, with timm's semantics.

With probability ``prob`` an image gets ``count`` boxes (a random number in 1..count when
count > 1), each of area uniform in ``area`` x H x W / number of boxes and aspect (h/w)
log-uniform in [aspect, 1/aspect], placed inside the image (10 tries per box, then none). The fill
is in normalised units: "const" = 0 (the mean colour), "rand" = one N(0, 1) colour per box,
"pixel" = N(0, 1) per pixel.
"""

import math
from dataclasses import dataclass
from typing import List, Tuple

import numpy as np

__all__ = ["ERASE_MODES", "ErasingSpec", "sample_erase_boxes", "erase_fill", "random_erase"]

ERASE_MODES = ("const", "rand", "pixel")


@dataclass(frozen=True)
class ErasingSpec:
    """Random-erasing parameters (data.random_erasing)."""
    prob: float = 0.0
    area: Tuple[float, float] = (0.02, 1 / 3)
    aspect: float = 0.3
    mode: str = "const"
    count: int = 1


def sample_erase_boxes(rng: np.random.Generator, height: int, width: int, spec: ErasingSpec
                       ) -> List[Tuple[int, int, int, int]]:
    """The (top, left, h, w) boxes one image gets (empty when it is not erased)."""
    if rng.random() > spec.prob:
        return []
    count = 1 if spec.count <= 1 else int(rng.integers(1, spec.count + 1))
    log_lo, log_hi = math.log(spec.aspect), math.log(1.0 / spec.aspect)
    boxes = []
    for _ in range(count):
        for _attempt in range(10):
            target = rng.uniform(spec.area[0], spec.area[1]) * height * width / count
            aspect = math.exp(rng.uniform(log_lo, log_hi))
            h = int(round(math.sqrt(target * aspect)))
            w = int(round(math.sqrt(target / aspect)))
            if w < width and h < height:
                top = int(rng.integers(0, height - h + 1))
                left = int(rng.integers(0, width - w + 1))
                boxes.append((top, left, h, w))
                break
    return boxes


def erase_fill(rng: np.random.Generator, channels: int, h: int, w: int, mode: str) -> np.ndarray:
    """What an erased (channels, h, w) box is filled with, broadcastable to that shape."""
    if mode == "pixel":
        return rng.standard_normal((channels, h, w), dtype=np.float32)
    if mode == "rand":
        return rng.standard_normal((channels, 1, 1), dtype=np.float32)
    return np.zeros((channels, 1, 1), np.float32)


def random_erase(x: np.ndarray, rng: np.random.Generator, spec: ErasingSpec) -> np.ndarray:
    """Erase boxes of a normalised (C, H, W) float array in place; returns it."""
    c, height, width = x.shape
    for top, left, h, w in sample_erase_boxes(rng, height, width, spec):
        x[:, top:top + h, left:left + w] = erase_fill(rng, c, h, w, spec.mode)
    return x
