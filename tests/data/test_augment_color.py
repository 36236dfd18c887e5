"""ColorJitter and PCA lighting of basebn.data.augment against closed forms (numpy, float64) and
Pillow's ImageEnhance (the peer implementation timm uses)."""

import numpy as np
import pytest
from PIL import Image, ImageEnhance

from basebn.data.augment import build_batch_augment, build_sample_transform
from basebn.data.augment.color import (IMAGENET_EIGVAL, IMAGENET_EIGVEC, adjust_brightness, adjust_contrast,
                                       adjust_saturation, color_jitter, sample_jitter)

MEAN, STD = (120.0, 110.0, 100.0), (60.0, 55.0, 50.0)


def _img(h=40, w=30, c=3, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (h, w, c), dtype=np.uint8)


def _grey64(x):
    return x[..., 0] * 0.299 + x[..., 1] * 0.587 + x[..., 2] * 0.114


@pytest.mark.parametrize("f", [0.0, 0.4, 1.0, 1.7])
def test_adjustments_match_the_blend_formulas_within_rounding(f):
    img = _img()
    x = img.astype(np.float64)
    got = [adjust_brightness(img, f), adjust_contrast(img, f), adjust_saturation(img, f)]
    ref = [np.clip(f * x, 0, 255), np.clip(f * x + (1 - f) * _grey64(x).mean(), 0, 255),
           np.clip(f * x + (1 - f) * _grey64(x)[..., None], 0, 255)]
    for g, r in zip(got, ref):
        assert g.dtype == np.uint8 and g.shape == img.shape
        assert np.abs(g - r).max() <= 1.0  # rounded to uint8; saturation's grey is rounded first


@pytest.mark.parametrize("op,enhancer", [(adjust_brightness, ImageEnhance.Brightness),
                                         (adjust_contrast, ImageEnhance.Contrast),
                                         (adjust_saturation, ImageEnhance.Color)])
def test_adjustments_agree_with_pillow_within_rounding(op, enhancer):
    img = _img(64, 64, seed=3)
    for f in (0.3, 1.5):
        ours = op(img, f).astype(int)
        pil = np.asarray(enhancer(Image.fromarray(img)).enhance(f)).astype(int)
        assert np.abs(ours - pil).max() <= 2  # Pillow uses fixed-point grey and an integer mean grey level


def test_factor_one_and_zero_strength_are_the_identity():
    img = _img()
    for op in (adjust_brightness, adjust_contrast, adjust_saturation):
        np.testing.assert_array_equal(op(img, 1.0), img)
    np.testing.assert_array_equal(color_jitter(img, np.random.default_rng(0), (0.0, 0.0, 0.0)), img)
    plain = build_sample_transform(dict(hflip=False), True, MEAN, STD, 30)
    jitter0 = build_sample_transform(dict(hflip=False, color_jitter=0.0), True, MEAN, STD, 30)
    np.testing.assert_array_equal(plain(img, np.random.default_rng(1)), jitter0(img, np.random.default_rng(1)))


def test_jitter_factors_are_in_range_and_the_order_is_a_permutation():
    seen = set()
    for seed in range(200):
        order, factors = sample_jitter(np.random.default_rng(seed), (0.4, 1.5, 0.0))
        assert sorted(order) == [0, 1, 2]
        seen.add(tuple(order))
        assert 0.6 <= factors[0] <= 1.4 and 0.0 <= factors[1] <= 2.5 and factors[2] is None
    assert len(seen) == 6


def test_color_jitter_applies_the_drawn_factors_in_the_drawn_order():
    img = _img(seed=5)
    order, factors = sample_jitter(np.random.default_rng(7), (0.4, 0.4, 0.4))
    x = img.astype(np.float64)
    for k in order:
        f = factors[k]
        if k == 0:
            x = np.clip(f * x, 0, 255)
        elif k == 1:
            x = np.clip(f * x + (1 - f) * _grey64(x).mean(), 0, 255)
        else:
            x = np.clip(f * x + (1 - f) * _grey64(x)[..., None], 0, 255)
        x = np.rint(x)  # each op rounds to uint8
    got = color_jitter(img, np.random.default_rng(7), (0.4, 0.4, 0.4)).astype(int)
    assert np.abs(got - x).max() <= 1


def test_saturation_leaves_a_grey_image_alone():
    g = _img(c=1)
    np.testing.assert_array_equal(adjust_saturation(g, 0.2), g)
    np.testing.assert_allclose(adjust_contrast(g, 0.5), np.rint(0.5 * g + 0.5 * g.mean()), atol=1)
    assert color_jitter(_img(c=1), np.random.default_rng(0), (0.4, 0.4, 0.4)).shape == (40, 30, 1)


def test_imagenet_eigenvectors_are_orthonormal():
    np.testing.assert_allclose(IMAGENET_EIGVEC.T @ IMAGENET_EIGVEC, np.eye(3), atol=2e-3)
    assert np.all(np.diff(IMAGENET_EIGVAL) < 0)


def test_batch_lighting_adds_the_pca_offset_per_image():
    x = np.random.default_rng(0).standard_normal((4, 3, 5, 6)).astype(np.float32)
    aug = build_batch_augment(dict(lighting=0.1), MEAN, STD)
    out = aug(x.copy(), np.random.default_rng(9))
    alpha = np.random.default_rng(9).normal(0.0, 0.1, (4, 3))
    # AlexNet: rgb = sum_j eigvec[:, j] * alpha_j * eigval_j, pixels in [0, 1] -> 255 * rgb in 0-255 units
    rgb = 255 * np.einsum("cj,nj->nc", IMAGENET_EIGVEC, alpha * IMAGENET_EIGVAL)
    np.testing.assert_allclose(out - x, np.broadcast_to((rgb / np.asarray(STD))[:, :, None, None], x.shape),
                               atol=1e-5)
    assert build_batch_augment(dict(lighting=0.0), MEAN, STD) is None
