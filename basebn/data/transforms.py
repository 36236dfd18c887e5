"""Batch augmentations on uint8 NHWC arrays, vectorised and deterministic given a Generator.

``sample_crop_flip`` draws the random parameters (in a fixed order) and ``crop_flip`` applies
them with one padded copy and one fancy-indexing gather, so tests (and users) can check the
exact crops: ``out[i] == padded[i, ys[i]:ys[i]+H, xs[i]:xs[i]+W]`` (reversed along W if
``flips[i]``).
"""

from typing import Optional, Sequence, Tuple

import numpy as np

from .errors import DataError

__all__ = ["DEFAULT_STATS", "pad_images", "sample_crop_flip", "crop_flip", "random_crop",
           "random_hflip", "normalize", "augment", "resolve_stats"]

# Per-channel (mean, std) in 0-255 units.
DEFAULT_STATS = {
    "fashion_mnist": ((72.94,), (90.02,)),
    "mnist": ((33.32,), (78.57,)),
    "cifar10": ((125.3, 123.0, 113.9), (63.0, 62.1, 66.7)),
    "cifar100": ((129.3, 124.1, 112.4), (68.2, 65.4, 70.4)),
}


def pad_images(images: np.ndarray, pad: int) -> np.ndarray:
    """Zero-pad H and W of an (N, H, W, C) batch by ``pad`` on each side."""
    if pad <= 0:
        return images
    n, h, w, c = images.shape
    out = np.zeros((n, h + 2 * pad, w + 2 * pad, c), images.dtype)
    out[:, pad:pad + h, pad:pad + w] = images
    return out


def sample_crop_flip(rng: np.random.Generator, n: int, pad: int, hflip: bool,
                     p_flip: float = 0.5) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Draw (ys, xs, flips) for ``n`` images: offsets into the padded image in [0, 2*pad]."""
    if pad > 0:
        ys = rng.integers(0, 2 * pad + 1, n)
        xs = rng.integers(0, 2 * pad + 1, n)
    else:
        ys = xs = np.zeros(n, np.int64)
    flips = rng.random(n) < p_flip if hflip else np.zeros(n, bool)
    return ys, xs, flips


def crop_flip(images: np.ndarray, pad: int, ys: np.ndarray, xs: np.ndarray,
              flips: Optional[np.ndarray] = None) -> np.ndarray:
    """Crop each zero-padded image at (ys[i], xs[i]) back to H x W, mirrored where flips[i].

    One gather for the whole batch: each pixel (all C channels viewed as one opaque item)
    is fetched from the flattened padded batch by a precomputed linear index.
    """
    n, h, w, c = images.shape
    if pad <= 0 and (flips is None or not np.any(flips)):
        return images
    padded = np.ascontiguousarray(pad_images(images, pad))
    hp, wp = h + 2 * pad, w + 2 * pad
    rows = np.asarray(ys)[:, None] + np.arange(h)                    # (n, h)
    cols = np.asarray(xs)[:, None] + np.arange(w)                    # (n, w)
    if flips is not None:
        cols = np.where(np.asarray(flips)[:, None], cols[:, ::-1], cols)
    lin = (np.arange(n)[:, None, None] * hp + rows[:, :, None]) * wp + cols[:, None, :]
    pixels = padded.reshape(n * hp * wp, c)
    if c > 1 or padded.dtype.itemsize > 1:  # one pixel = one void item of c * itemsize bytes
        pixels = pixels.view(np.dtype((np.void, c * padded.dtype.itemsize)))
    return np.take(pixels.reshape(-1), lin).view(images.dtype).reshape(n, h, w, c)


def random_crop(images: np.ndarray, pad: int, rng: np.random.Generator):
    """Random crop with zero padding; returns (crops, ys, xs)."""
    ys, xs, _ = sample_crop_flip(rng, len(images), pad, hflip=False)
    return crop_flip(images, pad, ys, xs), ys, xs


def random_hflip(images: np.ndarray, rng: np.random.Generator, p: float = 0.5):
    """Mirror each image along W with probability ``p``; returns (images, flips)."""
    flips = rng.random(len(images)) < p
    return np.where(flips[:, None, None, None], images[:, :, ::-1], images), flips


def augment(images: np.ndarray, rng: np.random.Generator, pad: int, hflip: bool):
    """Random crop + optional flip in one gather; returns (images, (ys, xs, flips))."""
    ys, xs, flips = sample_crop_flip(rng, len(images), pad, hflip)
    return crop_flip(images, pad, ys, xs, flips), (ys, xs, flips)


def normalize(images: np.ndarray, mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
    """uint8 (N, H, W, C) -> float32 (N, C, H, W) as (x - mean) / std, stats in 0-255 units."""
    c = images.shape[-1]
    mean = np.broadcast_to(np.asarray(mean, np.float32), (c,))
    inv = 1.0 / np.broadcast_to(np.asarray(std, np.float32), (c,))
    x = np.ascontiguousarray(images.transpose(0, 3, 1, 2), dtype=np.float32)
    x -= mean[:, None, None]
    x *= inv[:, None, None]
    return x


def resolve_stats(dataset, mean=None, std=None) -> Tuple[Tuple[float, ...], Tuple[float, ...]]:
    """Per-channel (mean, std) tuples: explicit values, else the dataset's defaults."""
    c = dataset.image_shape[0]
    out = []
    for given, default, what in ((mean, getattr(dataset, "mean", None), "mean"),
                                 (std, getattr(dataset, "std", None), "std")):
        v = given if given is not None else default
        if v is None:
            v = DEFAULT_STATS.get(dataset.name, ((127.5,), (64.0,)))[what == "std"]
        v = np.atleast_1d(np.asarray(v, np.float64))
        if v.size == 1:
            v = np.repeat(v, c)
        if v.size != c:
            raise DataError(f"data.{what} has {v.size} values but dataset {dataset.name} images "
                            f"have {c} channels; give {c} values (0-255 units) or one")
        if what == "std" and (v <= 0).any():
            raise DataError(f"data.std must be positive, got {tuple(v)}")
        out.append(tuple(float(x) for x in v))
    return out[0], out[1]
