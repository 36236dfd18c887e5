"""Build the per-sample transform, the batch augmentation and the Mixup/CutMix mixer from ``data``.

Train, per sample (uint8 HWC in, float32 normalised CHW out), in this order, every draw from the
Generator passed in: crop (RandomResizedCrop, or resize to the output size + zero-pad random crop),
horizontal flip, ColorJitter, AutoAugment/RandAugment, normalise, PCA lighting, random erasing.
Eval: resize the shorter side to floor(size / crop_pct), center crop, normalise. The callables are
picklable dataclasses, so worker processes can receive them.
"""

import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Tuple

import numpy as np

from ..errors import DataError
from ..transforms import crop_flip, normalize, sample_crop_flip
from .auto_augment import AugmentPolicy, apply_policy, parse_policy
from .color import apply_lighting, color_jitter, lighting_offsets
from .erasing import ERASE_MODES, ErasingSpec, random_erase
from .geometry import INTERPOLATIONS, center_crop, hflip, resize_shorter, resized_crop, sample_rrc_box
from .mix import MixSpec, mix_batch

__all__ = ["TRAIN_CROPS", "SampleTransform", "BatchAugment", "Mixer", "build_sample_transform",
           "build_batch_augment", "build_mixer"]

TRAIN_CROPS = ("random_resized", "pad")


def _get(cfg: Any, key: str, default=None):
    if cfg is None:
        return default
    value = cfg.get(key, default) if hasattr(cfg, "get") else getattr(cfg, key, default)
    return default if value is None else value


def _pair(cfg, key, default) -> Tuple[float, float]:
    v = _get(cfg, key, default)
    if not isinstance(v, (list, tuple)) or len(v) != 2 or not 0 < float(v[0]) <= float(v[1]):
        raise DataError(f"data.{key} must be two increasing positive numbers (low, high), got {v!r}")
    return float(v[0]), float(v[1])


def _jitter_strengths(cfg) -> Optional[Tuple[float, float, float]]:
    v = _get(cfg, "color_jitter")
    if v is None:
        return None
    vals = (v,) * 3 if isinstance(v, (int, float)) and not isinstance(v, bool) else v
    if not isinstance(vals, (list, tuple)) or len(vals) != 3 or any(
            isinstance(s, bool) or not isinstance(s, (int, float)) or not 0 <= s for s in vals):
        raise DataError(f"data.color_jitter must be None, a number >= 0 or (brightness, contrast, "
                        f"saturation) numbers >= 0, got {v!r}")
    vals = tuple(float(s) for s in vals)
    return vals if any(vals) else None


def erasing_spec(data_cfg) -> ErasingSpec:
    """data.random_erasing as an ErasingSpec (checked)."""
    re_cfg = _get(data_cfg, "random_erasing", {})
    spec = ErasingSpec(prob=float(_get(re_cfg, "prob", 0.0)),
                       area=tuple(float(a) for a in _get(re_cfg, "area", (0.02, 1 / 3))),
                       aspect=float(_get(re_cfg, "aspect", 0.3)), mode=_get(re_cfg, "mode", "const"),
                       count=int(_get(re_cfg, "count", 1)))
    if not (0 <= spec.prob <= 1 and len(spec.area) == 2 and 0 < spec.area[0] <= spec.area[1] <= 1
            and 0 < spec.aspect <= 1 and spec.mode in ERASE_MODES and spec.count >= 1):
        raise DataError(f"data.random_erasing needs prob in [0, 1], 0 < area[0] <= area[1] <= 1, "
                        f"aspect in (0, 1], mode in {ERASE_MODES}, count >= 1; got {spec}")
    return spec


@dataclass(frozen=True)
class SampleTransform:
    """The per-sample pipeline: ``(uint8 (H, W, C) image, Generator) -> float32 (C, S, S)``."""
    train: bool
    out_size: int
    mean: Tuple[float, ...]
    std: Tuple[float, ...]
    crop: str = "random_resized"
    scale: Tuple[float, float] = (0.08, 1.0)
    ratio: Tuple[float, float] = (3 / 4, 4 / 3)
    crop_pct: float = 0.875
    interpolation: str = "bilinear"
    pad: int = 4
    hflip: bool = True
    jitter: Optional[Tuple[float, float, float]] = None
    policy: Optional[AugmentPolicy] = None
    lighting: float = 0.0
    erasing: ErasingSpec = ErasingSpec()

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        if img.ndim == 2:
            img = img[:, :, None]
        size = self.out_size
        if not self.train:
            img = center_crop(resize_shorter(img, math.floor(size / self.crop_pct), self.interpolation), size)
            return normalize(img[None], self.mean, self.std)[0]
        if self.crop == "random_resized":
            box = sample_rrc_box(img.shape[0], img.shape[1], self.scale, self.ratio, rng)
            img = resized_crop(img, box, size, size, self.interpolation)
            if self.hflip and rng.random() < 0.5:
                img = hflip(img)
        else:
            if img.shape[:2] != (size, size):
                img = center_crop(resize_shorter(img, size, self.interpolation), size)
            ys, xs, flips = sample_crop_flip(rng, 1, self.pad, self.hflip)
            img = crop_flip(img[None], self.pad, ys, xs, flips)[0]
        if self.jitter is not None:
            img = color_jitter(img, rng, self.jitter)
        if self.policy is not None:
            fill = tuple(min(255, int(round(m))) for m in self.mean)
            img = apply_policy(np.ascontiguousarray(img), self.policy, rng, fill, self.interpolation)
        x = normalize(img[None], self.mean, self.std)
        if self.lighting > 0 and x.shape[1] == 3:
            apply_lighting(x, lighting_offsets(rng, 1, self.lighting), self.std)
        x = x[0]
        if self.erasing.prob > 0:
            random_erase(x, rng, self.erasing)
        return x


def build_sample_transform(data_cfg, train: bool, mean: Sequence[float], std: Sequence[float],
                           out_size: int, *, default_crop: str = "random_resized", default_pad: int = 4,
                           default_hflip: bool = True) -> SampleTransform:
    """The per-sample transform for ``data_cfg`` (``default_*``: the dataset's defaults for None keys)."""
    crop = _get(data_cfg, "train_crop", default_crop)
    interpolation = _get(data_cfg, "interpolation", "bilinear")
    crop_pct = float(_get(data_cfg, "crop_pct", 0.875))
    if crop not in TRAIN_CROPS:
        raise DataError(f"data.train_crop must be one of {TRAIN_CROPS} or None, got {crop!r}")
    if interpolation not in INTERPOLATIONS:
        raise DataError(f"data.interpolation must be one of {tuple(INTERPOLATIONS)}, got {interpolation!r}")
    if not 0 < crop_pct <= 1:
        raise DataError(f"data.crop_pct must be in (0, 1], got {crop_pct}")
    aa = _get(data_cfg, "auto_augment")
    return SampleTransform(
        train=bool(train), out_size=int(out_size), mean=tuple(float(m) for m in mean),
        std=tuple(float(s) for s in std), crop=crop, scale=_pair(data_cfg, "rrc_scale", (0.08, 1.0)),
        ratio=_pair(data_cfg, "rrc_ratio", (3 / 4, 4 / 3)), crop_pct=crop_pct,
        interpolation=interpolation, pad=int(_get(data_cfg, "pad", default_pad)),
        hflip=bool(_get(data_cfg, "hflip", default_hflip)), jitter=_jitter_strengths(data_cfg),
        policy=None if aa is None else parse_policy(aa), lighting=float(_get(data_cfg, "lighting", 0.0)),
        erasing=erasing_spec(data_cfg))


@dataclass(frozen=True)
class BatchAugment:
    """PCA lighting and random erasing of a normalised float32 (B, C, H, W) batch, in place."""
    std: Tuple[float, ...]
    lighting: float
    erasing: ErasingSpec

    def __call__(self, images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        if self.lighting > 0 and images.shape[1] == 3:
            apply_lighting(images, lighting_offsets(rng, len(images), self.lighting), self.std)
        if self.erasing.prob > 0:
            for x in images:
                random_erase(x, rng, self.erasing)
        return images


def build_batch_augment(data_cfg, mean: Sequence[float], std: Sequence[float]) -> Optional[BatchAugment]:
    """What the in-memory datasets get after pad-crop/flip + normalise; None when nothing applies."""
    lighting = float(_get(data_cfg, "lighting", 0.0))
    erasing = erasing_spec(data_cfg)
    if lighting <= 0 and erasing.prob <= 0:
        return None
    return BatchAugment(tuple(float(s) for s in std), lighting, erasing)


@dataclass(frozen=True)
class Mixer:
    """``(images (B, C, H, W), labels (B,), Generator) -> (mixed images, soft targets (B, K))``."""
    spec: MixSpec

    def __call__(self, images: np.ndarray, labels: np.ndarray, rng: np.random.Generator):
        out, targets, _ = mix_batch(images, labels, rng, self.spec)
        return out, targets


def build_mixer(data_cfg, num_classes: int, label_smoothing: float = 0.0) -> Optional[Mixer]:
    """Mixup/CutMix per data.mixup / data.cutmix (alphas); None when both are 0 or data.mix_prob is 0."""
    spec = MixSpec(mixup_alpha=float(_get(data_cfg, "mixup", 0.0)),
                   cutmix_alpha=float(_get(data_cfg, "cutmix", 0.0)),
                   prob=float(_get(data_cfg, "mix_prob", 1.0)),
                   switch_prob=float(_get(data_cfg, "mix_switch_prob", 0.5)),
                   label_smoothing=float(label_smoothing), num_classes=int(num_classes))
    if (spec.mixup_alpha <= 0 and spec.cutmix_alpha <= 0) or spec.prob <= 0:
        return None
    return Mixer(spec)
