"""RandomResizedCrop boxes, resized crop, eval resize + center crop, flips and pad-crop of
basebn.data.augment, against closed forms and cv2/numpy references."""

import math

import cv2
import numpy as np
import pytest

from basebn.data.augment import build_sample_transform
from basebn.data.augment.geometry import center_rrc_box, sample_rrc_box

MEAN, STD = (120.0, 110.0, 100.0), (60.0, 55.0, 50.0)


def _img(h=375, w=500, c=3, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (h, w, c), dtype=np.uint8)


def _norm(img):
    x = (img.astype(np.float64) - np.asarray(MEAN)) / np.asarray(STD)
    return x.transpose(2, 0, 1)


@pytest.mark.parametrize("hw", [(375, 500), (500, 375), (64, 64), (40, 300)])
def test_rrc_boxes_inside_the_image_with_area_and_aspect_in_range(hw):
    h, w = hw
    scale, ratio = (0.08, 1.0), (3 / 4, 4 / 3)
    for seed in range(300):
        top, left, bh, bw = sample_rrc_box(h, w, scale, ratio, np.random.default_rng(seed))
        assert 0 <= top and 0 <= left and top + bh <= h and left + bw <= w and bh > 0 and bw > 0
        if (top, left, bh, bw) == center_rrc_box(h, w, ratio):
            continue  # the fallback
        # w and h are rounded to whole pixels: allow half a pixel on each side
        area_lo = (math.sqrt(scale[0] * h * w) - 1) ** 2 / (h * w)
        assert area_lo - 1e-9 <= bh * bw / (h * w) <= 1.0
        assert ratio[0] * (bh - 0.5) / (bh + 0.5) <= (bw + 0.5) / bh
        assert (bw - 0.5) / bh <= ratio[1] * (bh + 0.5) / (bh - 0.5)


def test_rrc_falls_back_to_a_center_crop_clamped_to_the_ratio():
    # the target area (all of it) at aspect >= 2 never fits a square: every try fails
    box = sample_rrc_box(100, 100, (1.0, 1.0), (2.0, 3.0), np.random.default_rng(0))
    assert box == (25, 0, 50, 100)  # h = round(100 / 2), vertically centred
    box = sample_rrc_box(100, 100, (1.0, 1.0), (0.25, 0.5), np.random.default_rng(0))
    assert box == (0, 25, 100, 50)  # w = round(100 * 0.5)
    assert center_rrc_box(80, 100, (0.75, 4 / 3)) == (0, 0, 80, 100)


def test_rrc_area_fraction_is_uniform_in_scale_on_average():
    fracs = [np.prod(sample_rrc_box(1000, 1000, (0.2, 0.6), (1.0, 1.0), np.random.default_rng(s))[2:]) / 1e6
             for s in range(2000)]
    assert abs(np.mean(fracs) - 0.4) < 0.01  # mean of U(0.2, 0.6); sd of the mean ~0.0026


@pytest.mark.parametrize("interp,flag", [("bilinear", cv2.INTER_LINEAR), ("bicubic", cv2.INTER_CUBIC)])
def test_random_resized_crop_equals_crop_then_cv2_resize_of_the_same_box(interp, flag):
    img = _img()
    t = build_sample_transform(dict(hflip=False, interpolation=interp), True, MEAN, STD, 224)
    for seed in range(5):
        top, left, h, w = sample_rrc_box(375, 500, (0.08, 1.0), (3 / 4, 4 / 3), np.random.default_rng(seed))
        ref = cv2.resize(img[top:top + h, left:left + w], (224, 224), interpolation=flag)
        out = t(img, np.random.default_rng(seed))
        assert out.dtype == np.float32 and out.shape == (3, 224, 224)
        np.testing.assert_allclose(out, _norm(ref), rtol=0, atol=1e-5)


def test_flip_happens_half_the_time_and_mirrors():
    img = _img(64, 64)
    t = build_sample_transform(dict(rrc_scale=(1.0, 1.0), rrc_ratio=(1.0, 1.0)), True, MEAN, STD, 64)
    plain, mirrored = _norm(img), _norm(img[:, ::-1])
    flips = 0
    for seed in range(200):
        out = t(img, np.random.default_rng(seed))
        is_plain, is_mirror = np.allclose(out, plain, atol=1e-5), np.allclose(out, mirrored, atol=1e-5)
        assert is_plain != is_mirror
        flips += is_mirror
    assert 70 <= flips <= 130  # Binomial(200, 0.5): 4 sd


def test_eval_resizes_the_shorter_side_to_size_over_crop_pct_then_center_crops():
    img = _img(375, 500)
    t = build_sample_transform(dict(crop_pct=0.875), False, MEAN, STD, 224)
    # floor(224 / 0.875) = 256; 500 * 256 / 375 = 341.3 -> 341; crop offsets round(16), round(58.5) = 58
    ref = cv2.resize(img, (341, 256), interpolation=cv2.INTER_LINEAR)[16:240, 58:282]
    np.testing.assert_allclose(t(img, None), _norm(ref), atol=1e-5)
    tall = _img(500, 375)
    ref = cv2.resize(tall, (256, 341), interpolation=cv2.INTER_LINEAR)[58:282, 16:240]
    np.testing.assert_allclose(t(tall, None), _norm(ref), atol=1e-5)


def test_pad_crop_is_a_window_of_the_zero_padded_image():
    img = _img(32, 32)
    t = build_sample_transform(dict(train_crop="pad", pad=4), True, MEAN, STD, 32)
    padded = np.zeros((40, 40, 3), np.uint8)
    padded[4:36, 4:36] = img
    for seed in range(10):
        out = t(img, np.random.default_rng(seed))
        windows = [_norm(p[y:y + 32, x:x + 32]) for p in (padded, padded[:, ::-1])
                   for y in range(9) for x in range(9)]
        assert any(np.allclose(out, wnd, atol=1e-5) for wnd in windows)


def test_grayscale_images_keep_one_channel():
    img = _img(50, 70, 1)
    t = build_sample_transform(dict(auto_augment="rand-m9-mstd0.5", color_jitter=0.4,
                                    random_erasing=dict(prob=1.0, mode="pixel")), True, (100.0,), (50.0,), 32)
    assert t(img, np.random.default_rng(0)).shape == (1, 32, 32)
    assert t(img[..., 0], np.random.default_rng(0)).shape == (1, 32, 32)
