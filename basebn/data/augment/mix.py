"""Mixup and CutMix on a batch with soft targets (timm's "batch" mode).

With probability ``prob`` a batch is mixed with itself reversed: when both alphas are > 0,
CutMix is chosen with probability ``switch_prob``; lambda ~ Beta(alpha, alpha). Mixup blends
images, CutMix pastes one box (side sqrt(1 - lambda) of the image, centre uniform, clipped to the
image) and then sets lambda to the kept-area fraction. Targets are
``lambda * smooth(y) + (1 - lambda) * smooth(y reversed)`` with label smoothing
``off = s / K, on = 1 - s + s / K``, so each row sums to 1.
"""

from dataclasses import dataclass
from typing import Tuple

import numpy as np

__all__ = ["MixSpec", "sample_mix", "cutmix_box", "smooth_one_hot", "mix_targets", "mix_batch"]


@dataclass(frozen=True)
class MixSpec:
    """Mixup/CutMix parameters (data.mixup, data.cutmix, data.mix_prob, data.mix_switch_prob)."""
    mixup_alpha: float = 0.0
    cutmix_alpha: float = 0.0
    prob: float = 1.0
    switch_prob: float = 0.5
    label_smoothing: float = 0.0
    num_classes: int = 1000


def sample_mix(rng: np.random.Generator, spec: MixSpec) -> Tuple[float, bool]:
    """(lambda, use_cutmix) for one batch; lambda = 1 means the batch is left as it is."""
    if rng.random() >= spec.prob:
        return 1.0, False
    if spec.mixup_alpha > 0 and spec.cutmix_alpha > 0:
        use_cutmix = bool(rng.random() < spec.switch_prob)
        alpha = spec.cutmix_alpha if use_cutmix else spec.mixup_alpha
    elif spec.mixup_alpha > 0:
        use_cutmix, alpha = False, spec.mixup_alpha
    elif spec.cutmix_alpha > 0:
        use_cutmix, alpha = True, spec.cutmix_alpha
    else:
        return 1.0, False
    return float(rng.beta(alpha, alpha)), use_cutmix


def cutmix_box(rng: np.random.Generator, height: int, width: int, lam: float
               ) -> Tuple[Tuple[int, int, int, int], float]:
    """((y0, y1, x0, x1), lambda corrected to the kept-area fraction) for one CutMix."""
    ratio = np.sqrt(1.0 - lam)
    cut_h, cut_w = int(height * ratio), int(width * ratio)
    cy, cx = int(rng.integers(0, height)), int(rng.integers(0, width))
    y0, y1 = np.clip([cy - cut_h // 2, cy + cut_h // 2], 0, height)
    x0, x1 = np.clip([cx - cut_w // 2, cx + cut_w // 2], 0, width)
    kept = 1.0 - float((y1 - y0) * (x1 - x0)) / float(height * width)
    return (int(y0), int(y1), int(x0), int(x1)), kept


def smooth_one_hot(labels: np.ndarray, num_classes: int, smoothing: float) -> np.ndarray:
    """(B, K) float32 one-hot targets with label smoothing (off = s/K, on = 1 - s + s/K)."""
    off = smoothing / num_classes
    out = np.full((len(labels), num_classes), off, np.float32)
    out[np.arange(len(labels)), np.asarray(labels, np.int64)] = 1.0 - smoothing + off
    return out


def mix_targets(labels: np.ndarray, num_classes: int, lam: float, smoothing: float) -> np.ndarray:
    """Soft targets of a batch mixed with itself reversed: lam * y + (1 - lam) * y[::-1]."""
    y = smooth_one_hot(labels, num_classes, smoothing)
    return (lam * y + (1.0 - lam) * y[::-1]).astype(np.float32)


def mix_batch(images: np.ndarray, labels: np.ndarray, rng: np.random.Generator, spec: MixSpec
              ) -> Tuple[np.ndarray, np.ndarray, float]:
    """Mix a float32 (B, C, H, W) batch; returns (new images, soft targets (B, K), lambda)."""
    lam, use_cutmix = sample_mix(rng, spec)
    out = images
    if lam < 1.0 and use_cutmix:
        (y0, y1, x0, x1), lam = cutmix_box(rng, images.shape[2], images.shape[3], lam)
        out = images.copy()
        out[:, :, y0:y1, x0:x1] = images[::-1, :, y0:y1, x0:x1]
    elif lam < 1.0:
        lam32 = np.float32(lam)
        out = images * lam32 + images[::-1] * (np.float32(1.0) - lam32)
    return out, mix_targets(labels, spec.num_classes, lam, spec.label_smoothing), lam
