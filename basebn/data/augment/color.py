"""Colour augmentations: ColorJitter on uint8 HWC images and PCA lighting on normalised CHW arrays.

ColorJitter follows torchvision: each factor is uniform in [max(0, 1 - s), 1 + s], the three ops
run in a random order, and each blends the image with black (brightness), its mean grey
(contrast) or its grey version (saturation), clamped to [0, 255] and rounded to uint8 after each
op (cv2.addWeighted; torchvision's uint8 path truncates instead of rounding). Grey uses ITU-R 601
luma. PCA lighting is AlexNet's, with the ImageNet eigen-pairs of pycls/basecls (RGB order).
"""

from typing import Optional, Sequence, Tuple

import cv2
import numpy as np

__all__ = ["LUMA", "IMAGENET_EIGVAL", "IMAGENET_EIGVEC", "grayscale", "adjust_brightness",
           "adjust_contrast", "adjust_saturation", "sample_jitter", "color_jitter",
           "lighting_offsets", "apply_lighting"]

LUMA = np.array([0.299, 0.587, 0.114], np.float32)
# Eigenvalues / eigenvectors (columns) of the ImageNet RGB pixel covariance, pixels in [0, 1].
IMAGENET_EIGVAL = np.array([0.2175, 0.0188, 0.0045])
IMAGENET_EIGVEC = np.array([[-0.5675, 0.7192, 0.4009],
                            [-0.5808, -0.0045, -0.8140],
                            [-0.5836, -0.6948, 0.4203]])


def grayscale(x: np.ndarray) -> np.ndarray:
    """(H, W, C) -> (H, W) float luma; a one-channel image is its own grey."""
    return x[..., 0].astype(np.float32) if x.shape[-1] == 1 else x.astype(np.float32) @ LUMA


def _blend(img: np.ndarray, factor: float, other, offset: float = 0.0) -> np.ndarray:
    # cv2 computes in float and rounds + saturates to uint8 once: factor * img + (1 - factor) * other + offset
    other = img if other is None else other
    weight = 0.0 if other is img else 1.0 - factor
    return cv2.addWeighted(img, factor, other, weight, offset).reshape(img.shape)


def adjust_brightness(img: np.ndarray, factor: float) -> np.ndarray:
    """Blend a uint8 HWC image with black: ``round(clip(factor * img))``."""
    return _blend(img, factor, None)


def adjust_contrast(img: np.ndarray, factor: float) -> np.ndarray:
    """Blend a uint8 HWC image with its mean grey level."""
    means = np.asarray(cv2.mean(img)[:img.shape[-1]])
    mean = float(means[0] if img.shape[-1] == 1 else means @ LUMA)
    return _blend(img, factor, None, (1.0 - factor) * mean)


def adjust_saturation(img: np.ndarray, factor: float) -> np.ndarray:
    """Blend a uint8 RGB image with its grey version (rounded to uint8 first, as Pillow); grey images unchanged."""
    if img.shape[-1] == 1:
        return img
    grey = cv2.cvtColor(cv2.cvtColor(img, cv2.COLOR_RGB2GRAY), cv2.COLOR_GRAY2RGB)
    return _blend(img, factor, grey)


_ADJUST = (adjust_brightness, adjust_contrast, adjust_saturation)


def sample_jitter(rng: np.random.Generator, strengths: Sequence[float]
                  ) -> Tuple[np.ndarray, Tuple[Optional[float], ...]]:
    """(order, factors) as torchvision draws them: a permutation, then one factor per nonzero strength."""
    order = rng.permutation(3)
    factors = tuple(float(rng.uniform(max(0.0, 1.0 - s), 1.0 + s)) if s > 0 else None
                    for s in strengths)
    return order, factors


def color_jitter(img: np.ndarray, rng: np.random.Generator, strengths: Sequence[float]) -> np.ndarray:
    """Random brightness/contrast/saturation (``strengths`` = (b, c, s)) of a uint8 HWC image."""
    order, factors = sample_jitter(rng, strengths)
    img = np.ascontiguousarray(img)
    for k in order:
        if factors[k] is not None:
            img = _ADJUST[k](img, factors[k])
    return img


def lighting_offsets(rng: np.random.Generator, n: int, alpha_std: float) -> np.ndarray:
    """(n, 3) RGB offsets in 0-255 units: eigvec @ (alpha * eigval) * 255, alpha ~ N(0, alpha_std)."""
    alpha = rng.normal(0.0, alpha_std, (n, 3))
    return 255.0 * (alpha * IMAGENET_EIGVAL) @ IMAGENET_EIGVEC.T


def apply_lighting(x: np.ndarray, offsets: np.ndarray, std: Sequence[float]) -> np.ndarray:
    """Add per-image RGB ``offsets`` (n, 3; 0-255 units) to normalised (n, 3, H, W) ``x`` in place."""
    scaled = (offsets / np.asarray(std, np.float64)).astype(np.float32)
    x += scaled[:, :, None, None]
    return x
