"""AutoAugment/RandAugment of basebn.data.augment: op arguments against timm's published ranges,
ops against closed forms, identity-at-magnitude-0 ops, and the policy-string parser."""

import math

import numpy as np
import pytest
from PIL import Image

from basebn.data import DataError
from basebn.data.augment import apply_policy, parse_policy
from basebn.data.augment.auto_augment import (OP_NAMES, RAND_INCREASING_TRANSFORMS, RAND_TRANSFORMS, apply_op,
                                              op_arguments)

# ops whose magnitude-0 argument leaves an image as it is (the others, e.g. Solarize(0) = invert, do not)
IDENTITY_AT_ZERO = ["Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY", "TranslateXRel", "TranslateYRel",
                    "SolarizeIncreasing", "SolarizeAdd", "ColorIncreasing", "ContrastIncreasing",
                    "BrightnessIncreasing", "SharpnessIncreasing"]


def _img(h=48, w=40, c=3, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (h, w, c), dtype=np.uint8)


def _apply(img, name, args, fill=(7, 8, 9)):
    pil = Image.fromarray(img[..., 0] if img.shape[2] == 1 else img)
    fill = fill[0] if img.shape[2] == 1 else fill
    return np.asarray(apply_op(pil, name, args, fill)).reshape(img.shape)


@pytest.mark.parametrize("c", [1, 3])
@pytest.mark.parametrize("name", IDENTITY_AT_ZERO)
def test_ops_at_magnitude_zero_are_the_identity(name, c):
    img = _img(c=c)
    for negate in (False, True):
        np.testing.assert_array_equal(_apply(img, name, op_arguments(name, 0.0, negate, (48, 40))), img)


@pytest.mark.parametrize("name,m,expected", [
    ("Rotate", 10, 30.0), ("Rotate", 5, 15.0), ("ShearX", 10, 0.3), ("TranslateXRel", 10, 0.45),
    ("TranslateX", 10, float(int(40 * 0.45))), ("Posterize", 10, 4), ("Posterize", 5, 2),
    ("PosterizeIncreasing", 10, 0), ("PosterizeOriginal", 0, 4), ("PosterizeOriginal", 10, 8),
    ("Solarize", 10, 256), ("Solarize", 5, 128), ("SolarizeIncreasing", 10, 0), ("SolarizeAdd", 10, 110),
    ("Color", 10, 1.9), ("Color", 0, 0.1), ("Contrast", 5, 1.0), ("BrightnessIncreasing", 10, 1.9),
    ("Sharpness", 9, 1.72)])
def test_magnitude_maps_to_timms_ranges(name, m, expected):
    (arg,) = op_arguments(name, m, False, (48, 40))
    assert arg == pytest.approx(expected)


def test_signed_ops_are_negated_and_increasing_enhance_stays_above_0_1():
    assert op_arguments("Rotate", 10, True, (8, 8)) == (-30.0,)
    assert op_arguments("ColorIncreasing", 10, True, (8, 8))[0] == pytest.approx(0.1)
    assert op_arguments("Solarize", 10, True, (8, 8)) == (256,)  # unsigned ops ignore negate


def test_pixel_ops_match_closed_forms():
    img = _img()
    x = img.astype(int)
    np.testing.assert_array_equal(_apply(img, "Invert", ()), 255 - x)
    np.testing.assert_array_equal(_apply(img, "Solarize", (100,)), np.where(x >= 100, 255 - x, x))
    np.testing.assert_array_equal(_apply(img, "Solarize", (0,)), 255 - x)
    np.testing.assert_array_equal(_apply(img, "SolarizeAdd", (60,)), np.where(x < 128, np.minimum(255, x + 60), x))
    np.testing.assert_array_equal(_apply(img, "Posterize", (3,)), x & 0b11100000)
    np.testing.assert_array_equal(_apply(img, "Posterize", (8,)), x)
    bright = _apply(img, "Brightness", (1.3,)).astype(int)
    assert np.abs(bright - np.clip(np.rint(1.3 * x), 0, 255)).max() <= 1


@pytest.mark.parametrize("name,axis", [("TranslateXRel", 1), ("TranslateYRel", 0)])
def test_translation_by_whole_pixels_shifts_and_fills(name, axis):
    img = _img(40, 40)
    out = _apply(img, name, (0.25,))  # 10 pixels: output(x) = input(x + 10)
    keep = [slice(None)] * 3
    keep[axis] = slice(0, 30)
    src = [slice(None)] * 3
    src[axis] = slice(10, 40)
    np.testing.assert_array_equal(out[tuple(keep)], img[tuple(src)])
    keep[axis] = slice(30, 40)
    assert np.all(out[tuple(keep)] == np.array([7, 8, 9]))


def test_parse_rand_augment_strings():
    p = parse_policy("rand-m9-mstd0.5")
    assert p.kind == "rand" and p.num_layers == 2 and p.magnitude_std == 0.5 and p.magnitude_max == 10
    assert [op.name for op in p.choices] == list(RAND_TRANSFORMS) and len(p.choices) == 15
    assert all(op.magnitude == 9 and op.prob == 0.5 for op in p.choices)
    p = parse_policy("rand-m7-n3-inc1-mmax12-p0.8")
    assert [op.name for op in p.choices] == list(RAND_INCREASING_TRANSFORMS)
    assert p.num_layers == 3 and p.magnitude_max == 12 and p.choices[0].prob == 0.8
    assert parse_policy("rand-mstd101").magnitude_std == math.inf
    assert [op.name for op in parse_policy("rand-inc0").choices] == list(RAND_TRANSFORMS)
    assert set(RAND_INCREASING_TRANSFORMS) <= set(OP_NAMES)


def test_parse_auto_augment_policies():
    p = parse_policy("autoaugment")
    assert p.kind == "auto" and len(p.choices) == 25 and all(len(s) == 2 for s in p.choices)
    assert p.choices[0][0].name == "PosterizeOriginal" and p.choices[0][0].prob == 0.4
    assert parse_policy("original") == p
    assert parse_policy("v0-mstd0.5").magnitude_std == 0.5


@pytest.mark.parametrize("bad", ["rand-x9", "rand-m", "augmix-m5", "rand-n0", "rand-p2", "original-m9", "",
                                 "rand-mfoo"])
def test_bad_policy_strings_fail_naming_the_problem(bad):
    with pytest.raises(DataError, match="auto_augment|AutoAugment"):
        parse_policy(bad)


@pytest.mark.parametrize("policy", ["rand-m9-mstd0.5", "rand-m15-mmax20-n4", "autoaugment", "v0-mstd1"])
@pytest.mark.parametrize("c", [1, 3])
def test_policies_run_deterministically_given_the_generator(policy, c):
    p = parse_policy(policy)
    img = _img(c=c)
    outs = [apply_policy(img, p, np.random.default_rng(s), (124, 116, 104)) for s in (0, 0, 1, 2, 3)]
    assert outs[0].shape == img.shape and outs[0].dtype == np.uint8
    np.testing.assert_array_equal(outs[0], outs[1])
    assert any(not np.array_equal(o, img) for o in outs)


def test_rand_augment_with_probability_zero_is_the_identity():
    img = _img()
    p = parse_policy("rand-m9-n4-p0")
    np.testing.assert_array_equal(apply_policy(img, p, np.random.default_rng(0), (0, 0, 0)), img)
