"""AutoAugment (ImageNet policies) and RandAugment from timm's policy strings, on uint8 HWC images.

Ops, magnitude-to-argument maps (magnitude M of 10 = full strength), per-op probabilities and
policies are timm's (``timm/data/auto_augment.py``), run with Pillow as timm does; every random
draw (op choice, apply-or-skip, magnitude noise, sign) comes from the numpy Generator passed in.
Policy strings: ``rand-m9-mstd0.5`` (sections m, n, mstd (>100 = uniform), mmax, inc, p), and
``autoaugment``/``original`` (the AutoAugment paper's ImageNet policy) or ``v0`` (timm's TPU
EfficientNet policy), optionally with ``-mstd0.5``.
"""

import math
import re
from dataclasses import dataclass
from typing import Sequence, Tuple, Union

import numpy as np
from PIL import Image, ImageEnhance, ImageOps

from ..errors import DataError

__all__ = ["LEVEL_DENOM", "RAND_TRANSFORMS", "RAND_INCREASING_TRANSFORMS", "OP_NAMES", "AugmentOp",
           "AugmentPolicy", "parse_policy", "op_arguments", "apply_op", "apply_policy",
           "PIL_RESAMPLE"]

LEVEL_DENOM = 10.0
PIL_RESAMPLE = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC,
                "area": Image.Resampling.BILINEAR, "nearest": Image.Resampling.NEAREST}


def _affine(img, matrix, fill, resample):
    return img.transform(img.size, Image.Transform.AFFINE, matrix, resample=resample, fillcolor=fill)


def _solarize_add(img, add, thresh=128):
    lut = [min(255, i + add) if i < thresh else i for i in range(256)]
    return img.point(lut * len(img.getbands()))


def _posterize(img, bits):
    return img if bits >= 8 else ImageOps.posterize(img, bits)


# name -> f(img, *args, fill, resample)
_OPS = {
    "AutoContrast": lambda img, fill, resample: ImageOps.autocontrast(img),
    "Equalize": lambda img, fill, resample: ImageOps.equalize(img),
    "Invert": lambda img, fill, resample: ImageOps.invert(img),
    "Rotate": lambda img, deg, fill, resample: img.rotate(deg, resample=resample, fillcolor=fill),
    "Posterize": lambda img, bits, fill, resample: _posterize(img, bits),
    "Solarize": lambda img, thresh, fill, resample: ImageOps.solarize(img, thresh),
    "SolarizeAdd": lambda img, add, fill, resample: _solarize_add(img, add),
    "Color": lambda img, f, fill, resample: ImageEnhance.Color(img).enhance(f),
    "Contrast": lambda img, f, fill, resample: ImageEnhance.Contrast(img).enhance(f),
    "Brightness": lambda img, f, fill, resample: ImageEnhance.Brightness(img).enhance(f),
    "Sharpness": lambda img, f, fill, resample: ImageEnhance.Sharpness(img).enhance(f),
    "ShearX": lambda img, f, fill, resample: _affine(img, (1, f, 0, 0, 1, 0), fill, resample),
    "ShearY": lambda img, f, fill, resample: _affine(img, (1, 0, 0, f, 1, 0), fill, resample),
    "TranslateX": lambda img, px, fill, resample: _affine(img, (1, 0, px, 0, 1, 0), fill, resample),
    "TranslateY": lambda img, px, fill, resample: _affine(img, (1, 0, 0, 0, 1, px), fill, resample),
    "TranslateXRel": lambda img, pct, fill, resample: _affine(
        img, (1, 0, pct * img.size[0], 0, 1, 0), fill, resample),
    "TranslateYRel": lambda img, pct, fill, resample: _affine(
        img, (1, 0, 0, 0, 1, pct * img.size[1]), fill, resample),
}
# the variants differ from their base op only in the magnitude-to-argument map
_VARIANT_OF = {"PosterizeIncreasing": "Posterize", "PosterizeOriginal": "Posterize",
               "SolarizeIncreasing": "Solarize", "ColorIncreasing": "Color",
               "ContrastIncreasing": "Contrast", "BrightnessIncreasing": "Brightness",
               "SharpnessIncreasing": "Sharpness"}
OP_NAMES = tuple(sorted(set(_OPS) | set(_VARIANT_OF)))

# ops whose argument gets a random sign
_SIGNED = {"Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY", "TranslateXRel", "TranslateYRel",
           "ColorIncreasing", "ContrastIncreasing", "BrightnessIncreasing", "SharpnessIncreasing"}

RAND_TRANSFORMS = ("AutoContrast", "Equalize", "Invert", "Rotate", "Posterize", "Solarize",
                   "SolarizeAdd", "Color", "Contrast", "Brightness", "Sharpness", "ShearX", "ShearY",
                   "TranslateXRel", "TranslateYRel")
RAND_INCREASING_TRANSFORMS = ("AutoContrast", "Equalize", "Invert", "Rotate", "PosterizeIncreasing",
                              "SolarizeIncreasing", "SolarizeAdd", "ColorIncreasing",
                              "ContrastIncreasing", "BrightnessIncreasing", "SharpnessIncreasing",
                              "ShearX", "ShearY", "TranslateXRel", "TranslateYRel")


def op_arguments(name: str, magnitude: float, negate: bool, image_size: Tuple[int, int]) -> tuple:
    """timm's level-to-argument map for op ``name`` at ``magnitude`` (``negate`` flips signed ops)."""
    level = magnitude / LEVEL_DENOM
    sign = -1.0 if negate and name in _SIGNED else 1.0
    if name in ("AutoContrast", "Equalize", "Invert"):
        return ()
    if name == "Rotate":
        return (sign * level * 30.0,)
    if name in ("ShearX", "ShearY"):
        return (sign * level * 0.3,)
    if name in ("TranslateX", "TranslateY"):
        return (sign * level * float(int(min(image_size) * 0.45)),)
    if name in ("TranslateXRel", "TranslateYRel"):
        return (sign * level * 0.45,)
    if name == "Posterize":
        return (int(level * 4),)
    if name == "PosterizeIncreasing":
        return (4 - int(level * 4),)
    if name == "PosterizeOriginal":
        return (int(level * 4) + 4,)
    if name == "Solarize":
        return (min(256, int(level * 256)),)
    if name == "SolarizeIncreasing":
        return (256 - min(256, int(level * 256)),)
    if name == "SolarizeAdd":
        return (min(128, int(level * 110)),)
    if name.endswith("Increasing"):
        return (max(0.1, 1.0 + sign * level * 0.9),)
    return (level * 1.8 + 0.1,)  # Color, Contrast, Brightness, Sharpness


@dataclass(frozen=True)
class AugmentOp:
    """One op with its apply probability and magnitude (0..10 scale)."""
    name: str
    prob: float
    magnitude: float


@dataclass(frozen=True)
class AugmentPolicy:
    """kind "rand": pick ``num_layers`` of ``choices`` (AugmentOps) with replacement;
    kind "auto": pick one of ``choices`` (sub-policies, tuples of AugmentOps) and run it."""
    kind: str
    choices: tuple
    num_layers: int = 2
    magnitude_std: float = 0.0
    magnitude_max: float = LEVEL_DENOM


_AA_ORIGINAL = [
    [("PosterizeOriginal", 0.4, 8), ("Rotate", 0.6, 9)], [("Solarize", 0.6, 5), ("AutoContrast", 0.6, 5)],
    [("Equalize", 0.8, 8), ("Equalize", 0.6, 3)], [("PosterizeOriginal", 0.6, 7), ("PosterizeOriginal", 0.6, 6)],
    [("Equalize", 0.4, 7), ("Solarize", 0.2, 4)], [("Equalize", 0.4, 4), ("Rotate", 0.8, 8)],
    [("Solarize", 0.6, 3), ("Equalize", 0.6, 7)], [("PosterizeOriginal", 0.8, 5), ("Equalize", 1.0, 2)],
    [("Rotate", 0.2, 3), ("Solarize", 0.6, 8)], [("Equalize", 0.6, 8), ("PosterizeOriginal", 0.4, 6)],
    [("Rotate", 0.8, 8), ("Color", 0.4, 0)], [("Rotate", 0.4, 9), ("Equalize", 0.6, 2)],
    [("Equalize", 0.0, 7), ("Equalize", 0.8, 8)], [("Invert", 0.6, 4), ("Equalize", 1.0, 8)],
    [("Color", 0.6, 4), ("Contrast", 1.0, 8)], [("Rotate", 0.8, 8), ("Color", 1.0, 2)],
    [("Color", 0.8, 8), ("Solarize", 0.8, 7)], [("Sharpness", 0.4, 7), ("Invert", 0.6, 8)],
    [("ShearX", 0.6, 5), ("Equalize", 1.0, 9)], [("Color", 0.4, 0), ("Equalize", 0.6, 3)],
    [("Equalize", 0.4, 7), ("Solarize", 0.2, 4)], [("Solarize", 0.6, 5), ("AutoContrast", 0.6, 5)],
    [("Invert", 0.6, 4), ("Equalize", 1.0, 8)], [("Color", 0.6, 4), ("Contrast", 1.0, 8)],
    [("Equalize", 0.8, 8), ("Equalize", 0.6, 3)],
]
_AA_V0 = [
    [("Equalize", 0.8, 1), ("ShearY", 0.8, 4)], [("Color", 0.4, 9), ("Equalize", 0.6, 3)],
    [("Color", 0.4, 1), ("Rotate", 0.6, 8)], [("Solarize", 0.8, 3), ("Equalize", 0.4, 7)],
    [("Solarize", 0.4, 2), ("Solarize", 0.6, 2)], [("Color", 0.2, 0), ("Equalize", 0.8, 8)],
    [("Equalize", 0.4, 8), ("SolarizeAdd", 0.8, 3)], [("ShearX", 0.2, 9), ("Rotate", 0.6, 8)],
    [("Color", 0.6, 1), ("Equalize", 1.0, 2)], [("Invert", 0.4, 9), ("Rotate", 0.6, 0)],
    [("Equalize", 1.0, 9), ("ShearY", 0.6, 3)], [("Color", 0.4, 7), ("Equalize", 0.6, 0)],
    [("Posterize", 0.4, 6), ("AutoContrast", 0.4, 7)], [("Solarize", 0.6, 8), ("Color", 0.6, 9)],
    [("Solarize", 0.2, 4), ("Rotate", 0.8, 9)], [("Rotate", 1.0, 7), ("TranslateYRel", 0.8, 9)],
    [("ShearX", 0.0, 0), ("Solarize", 0.8, 4)], [("ShearY", 0.8, 0), ("Color", 0.6, 4)],
    [("Color", 1.0, 0), ("Rotate", 0.6, 2)], [("Equalize", 0.8, 4), ("Equalize", 0.0, 8)],
    [("Equalize", 1.0, 4), ("AutoContrast", 0.6, 2)], [("ShearY", 0.4, 7), ("SolarizeAdd", 0.6, 7)],
    [("Posterize", 0.8, 2), ("Solarize", 0.6, 10)], [("Solarize", 0.6, 8), ("Equalize", 0.6, 1)],
    [("Color", 0.8, 6), ("Rotate", 0.4, 5)],
]
_AA_POLICIES = {"autoaugment": _AA_ORIGINAL, "original": _AA_ORIGINAL, "v0": _AA_V0}
_HELP = ("use 'rand-m9-mstd0.5' style RandAugment strings (sections m, n, mstd, mmax, inc, p) or "
         "'autoaugment', 'original', 'v0' (optionally with '-mstd0.5')")


def _sections(text: str, parts: Sequence[str]):
    for part in parts:
        m = re.fullmatch(r"([a-z]+)(\d.*)", part)
        if m is None:
            raise DataError(f"cannot read section {part!r} of data.auto_augment={text!r}; {_HELP}")
        try:
            yield m.group(1), float(m.group(2))
        except ValueError:
            raise DataError(f"section {part!r} of data.auto_augment={text!r} is not a number; "
                            f"{_HELP}") from None


def parse_policy(text: str) -> AugmentPolicy:
    """The policy a timm-style string describes; DataError naming the bad part otherwise."""
    if not isinstance(text, str) or not text:
        raise DataError(f"data.auto_augment must be a policy string, got {text!r}; {_HELP}")
    head, *parts = text.split("-")
    mstd, mmax = 0.0, LEVEL_DENOM
    if head in _AA_POLICIES:
        for key, val in _sections(text, parts):
            if key != "mstd":
                raise DataError(f"AutoAugment policy {text!r} takes only an mstd section, got {key!r}")
            mstd = val
        subs = tuple(tuple(AugmentOp(*op) for op in sub) for sub in _AA_POLICIES[head])
        return AugmentPolicy("auto", subs, 0, mstd, mmax)
    if head != "rand":
        raise DataError(f"unknown data.auto_augment policy {text!r}; {_HELP}")
    magnitude, layers, prob, names = LEVEL_DENOM, 2, 0.5, RAND_TRANSFORMS
    for key, val in _sections(text, parts):
        if key == "m":
            magnitude = val
        elif key == "n" and val >= 1 and float(val).is_integer():
            layers = int(val)
        elif key == "mstd":
            mstd = math.inf if val > 100 else val
        elif key == "mmax" and val > 0:
            mmax = val
        elif key == "inc":
            names = RAND_INCREASING_TRANSFORMS if int(val) else RAND_TRANSFORMS
        elif key == "p" and 0 <= val <= 1:
            prob = val
        else:
            raise DataError(f"bad section {key}{val:g} in data.auto_augment={text!r}; {_HELP}")
    ops = tuple(AugmentOp(name, prob, magnitude) for name in names)
    return AugmentPolicy("rand", ops, layers, mstd, mmax)


def apply_op(img: Image.Image, name: str, args: tuple, fill: Union[int, Tuple[int, ...]],
             resample=Image.Resampling.BILINEAR) -> Image.Image:
    """Run op ``name`` with its arguments on a PIL image (fill: the colour of uncovered pixels)."""
    return _OPS[_VARIANT_OF.get(name, name)](img, *args, fill=fill, resample=resample)


def _maybe_apply(img, op: AugmentOp, policy: AugmentPolicy, rng, fill, resample):
    if op.prob < 1.0 and rng.random() > op.prob:
        return img
    magnitude = op.magnitude
    if policy.magnitude_std == math.inf:
        magnitude = rng.uniform(0.0, magnitude)
    elif policy.magnitude_std > 0:
        magnitude = rng.normal(magnitude, policy.magnitude_std)
    magnitude = max(0.0, min(magnitude, policy.magnitude_max))
    negate = bool(rng.random() < 0.5) if op.name in _SIGNED else False
    return apply_op(img, op.name, op_arguments(op.name, magnitude, negate, img.size[::-1]), fill, resample)


def apply_policy(img: np.ndarray, policy: AugmentPolicy, rng: np.random.Generator,
                 fill: Sequence[int], interpolation: str = "bilinear") -> np.ndarray:
    """Augment a uint8 (H, W, C) image (C = 1 or 3) with ``policy``; ``fill`` has one value per channel."""
    h, w, c = img.shape
    pil = Image.fromarray(img[..., 0] if c == 1 else img)
    fill = int(fill[0]) if c == 1 else tuple(int(v) for v in fill)
    resample = PIL_RESAMPLE[interpolation]
    if policy.kind == "rand":
        ops = [policy.choices[i] for i in rng.integers(0, len(policy.choices), policy.num_layers)]
    else:
        ops = policy.choices[int(rng.integers(0, len(policy.choices)))]
    for op in ops:
        pil = _maybe_apply(pil, op, policy, rng, fill, resample)
    return np.asarray(pil).reshape(h, w, c)
