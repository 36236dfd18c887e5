"""Random erasing and Mixup/CutMix of basebn.data.augment against closed forms: erased boxes inside
the image with the specified fill, Mixup targets = lambda, CutMix lambda = kept-area fraction."""

import math

import numpy as np
import pytest

from basebn.data.augment import build_batch_augment, build_mixer
from basebn.data.augment.erasing import ErasingSpec, random_erase
from basebn.data.augment.mix import MixSpec, mix_batch, smooth_one_hot

MEAN, STD = (120.0, 110.0, 100.0), (60.0, 55.0, 50.0)
BG = 100.0  # background value no fill can produce exactly


def _erased_mask(out):
    return np.any(out != BG, axis=0)


def _bounding_box(mask):
    ys, xs = np.nonzero(mask)
    return ys.min(), xs.min(), ys.max() - ys.min() + 1, xs.max() - xs.min() + 1


@pytest.mark.parametrize("mode", ["const", "rand", "pixel"])
def test_erased_box_is_inside_with_area_aspect_and_fill_as_specified(mode):
    spec = ErasingSpec(prob=1.0, area=(0.05, 0.3), aspect=0.4, mode=mode, count=1)
    h, w = 60, 80
    for seed in range(40):
        out = random_erase(np.full((3, h, w), BG, np.float32), np.random.default_rng(seed), spec)
        mask = _erased_mask(out)
        top, left, bh, bw = _bounding_box(mask)
        assert mask.sum() == bh * bw  # one solid rectangle (inside the array by construction)
        assert bh < h and bw < w
        # area: uniform in [0.05, 0.3] of h*w before rounding each side to whole pixels
        lo = (math.sqrt(0.05 * h * w * 0.4) - 0.5) * (math.sqrt(0.05 * h * w / (1 / 0.4)) - 0.5)
        assert lo <= bh * bw <= (math.sqrt(0.3 * h * w) + 1) ** 2 + 1
        assert 0.4 * 0.7 <= bh / bw <= 2.5 / 0.7
        region = out[:, top:top + bh, left:left + bw]
        if mode == "const":
            assert np.all(region == 0)
        elif mode == "rand":
            assert np.all(region == region[:, :1, :1]) and np.ptp(region[:, 0, 0]) > 0
        else:
            assert len(np.unique(region)) > region.size // 2


def test_pixel_fill_is_standard_normal():
    spec = ErasingSpec(prob=1.0, area=(0.3, 0.3), aspect=1.0, mode="pixel")
    vals = np.concatenate([random_erase(np.full((3, 100, 100), BG, np.float32), np.random.default_rng(s), spec)
                           for s in range(5)], axis=None)
    vals = vals[vals != BG]
    assert abs(vals.mean()) < 0.02 and abs(vals.std() - 1) < 0.02


def test_erasing_probability_and_count():
    x = np.full((3, 40, 40), BG, np.float32)
    erased = sum(_erased_mask(random_erase(x.copy(), np.random.default_rng(s), ErasingSpec(prob=0.25))).any()
                 for s in range(400))
    assert 70 <= erased <= 130  # Binomial(400, 0.25): about 3.5 sd
    assert not _erased_mask(random_erase(x.copy(), np.random.default_rng(0), ErasingSpec(prob=0.0))).any()
    spec = ErasingSpec(prob=1.0, area=(0.01, 0.02), count=3, mode="rand")
    counts = set()
    for s in range(60):
        out = random_erase(np.full((3, 100, 100), BG, np.float32), np.random.default_rng(s), spec)
        counts.add(len({tuple(out[:, i, j]) for i, j in zip(*np.nonzero(_erased_mask(out)))}))
    assert counts <= {1, 2, 3} and len(counts) >= 2


def test_batch_augment_erases_each_sample_of_a_batch():
    aug = build_batch_augment(dict(random_erasing=dict(prob=1.0, area=(0.1, 0.2), aspect=0.5, mode="const",
                                                       count=1)), MEAN, STD)
    x = np.full((8, 3, 32, 32), BG, np.float32)
    out = aug(x, np.random.default_rng(0))
    assert all(_erased_mask(o).any() for o in out)
    boxes = {_bounding_box(_erased_mask(o)) for o in out}
    assert len(boxes) > 1  # each sample draws its own box
    assert build_batch_augment(dict(), MEAN, STD) is None


def _batch(b=6, k=10):
    images = np.arange(b, dtype=np.float32)[:, None, None, None] * np.ones((1, 3, 20, 30), np.float32)
    labels = np.array([3, 1, 4, 0, 5, 9][:b], np.int32)
    return images, labels, k


def test_mixup_targets_sum_to_one_and_equal_lambda():
    images, labels, k = _batch()
    spec = MixSpec(mixup_alpha=0.4, num_classes=k)
    for seed in range(10):
        out, targets, lam = mix_batch(images, labels, np.random.default_rng(seed), spec)
        np.testing.assert_allclose(targets.sum(1), 1.0, atol=1e-6)
        for i in range(len(labels)):
            j = len(labels) - 1 - i
            assert targets[i, labels[i]] == pytest.approx(lam, abs=1e-6)
            assert targets[i, labels[j]] == pytest.approx(1 - lam, abs=1e-6)
            np.testing.assert_allclose(out[i], lam * i + (1 - lam) * j, atol=1e-5)


def test_label_smoothing_in_the_soft_targets():
    labels = np.array([2, 0, 1], np.int32)
    t = smooth_one_hot(labels, 4, 0.1)
    np.testing.assert_allclose(t, np.eye(4)[labels] * 0.9 + 0.025, atol=1e-7)
    mixer = build_mixer(dict(mixup=1.0), 4, label_smoothing=0.1)
    _, targets = mixer(np.zeros((3, 1, 4, 4), np.float32), labels, np.random.default_rng(0))
    np.testing.assert_allclose(targets.sum(1), 1.0, atol=1e-6)
    assert targets.min() >= 0.025 - 1e-7


def test_cutmix_lambda_is_the_kept_area_fraction():
    images, labels, k = _batch()
    spec = MixSpec(cutmix_alpha=1.0, num_classes=k)
    for seed in range(20):
        out, targets, lam = mix_batch(images, labels, np.random.default_rng(seed), spec)
        for i in range(len(labels)):
            j = len(labels) - 1 - i
            kept = np.mean(out[i] == i)
            pasted = out[i] != i
            assert np.all(out[i][pasted] == j)
            if pasted.any():  # one rectangle, the same for every channel
                ys, xs = np.nonzero(pasted[0])
                assert pasted[0].sum() == (ys.ptp() + 1) * (xs.ptp() + 1) and np.all(pasted == pasted[0])
            assert kept == pytest.approx(lam, abs=1e-9)
            assert targets[i, labels[i]] == pytest.approx(lam, abs=1e-6)


def test_switch_probability_and_mix_probability():
    images, labels, k = _batch()

    def is_cutmix(out):
        return np.isin(out, images).all() and not np.array_equal(out, images)

    always_cut = MixSpec(mixup_alpha=1.0, cutmix_alpha=1.0, switch_prob=1.0, num_classes=k)
    never_cut = MixSpec(mixup_alpha=1.0, cutmix_alpha=1.0, switch_prob=0.0, num_classes=k)
    cuts = [is_cutmix(mix_batch(images, labels, np.random.default_rng(s), always_cut)[0]) for s in range(30)]
    mixes = [is_cutmix(mix_batch(images, labels, np.random.default_rng(s), never_cut)[0]) for s in range(30)]
    assert sum(cuts) >= 25 and sum(mixes) == 0  # a CutMix box can be empty (lambda -> 1)
    half = MixSpec(mixup_alpha=1.0, prob=0.5, num_classes=k)
    untouched = sum(mix_batch(images, labels, np.random.default_rng(s), half)[2] == 1.0 for s in range(400))
    assert 160 <= untouched <= 240  # Binomial(400, 0.5): 4 sd
    assert build_mixer(dict(), 10) is None and build_mixer(dict(mixup=0.8, mix_prob=0.0), 10) is None


def test_mixup_lambda_follows_beta_alpha_alpha():
    images, labels, k = _batch()
    lams = [mix_batch(images, labels, np.random.default_rng(s), MixSpec(mixup_alpha=0.2, num_classes=k))[2]
            for s in range(3000)]
    # Beta(0.2, 0.2): mean 1/2, variance 1 / (4 * 1.4)
    assert abs(np.mean(lams) - 0.5) < 0.03 and abs(np.var(lams) - 1 / 5.6) < 0.02
