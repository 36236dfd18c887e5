"""The builders of basebn.data.augment: determinism, picklability, step order, and the config rules
of the augmentation keys."""

import pickle

import cv2
import numpy as np
import pytest

from basebn.config import BaseConfig, flatten
from basebn.config.checks import CheckFailed, check_values
from basebn.data import DataError
from basebn.data.augment import build_sample_transform
from basebn.data.augment.geometry import sample_rrc_box

MEAN, STD = (124.0, 116.0, 104.0), (58.0, 57.0, 57.0)
FULL = dict(auto_augment="rand-m9-mstd0.5", color_jitter=0.4, lighting=0.1,
            random_erasing=dict(prob=0.5, area=(0.02, 1 / 3), aspect=0.3, mode="pixel", count=2))


def _img(h=120, w=160, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def test_train_transform_is_a_pure_function_of_image_and_generator():
    t = build_sample_transform(FULL, True, MEAN, STD, 64)
    img = _img()
    a = t(img, np.random.default_rng(3))
    assert a.shape == (3, 64, 64) and a.dtype == np.float32
    np.testing.assert_array_equal(a, t(img, np.random.default_rng(3)))
    np.testing.assert_array_equal(a, pickle.loads(pickle.dumps(t))(img, np.random.default_rng(3)))
    assert not np.array_equal(a, t(img, np.random.default_rng(4)))
    np.testing.assert_array_equal(img, _img())  # the input is not modified


def test_erasing_runs_after_normalisation_so_const_fill_is_the_mean_colour():
    cfg = dict(hflip=False, random_erasing=dict(prob=1.0, area=(0.1, 0.2), aspect=0.5, mode="const", count=1))
    t = build_sample_transform(cfg, True, MEAN, STD, 48)
    img = _img()
    top, left, h, w = sample_rrc_box(120, 160, (0.08, 1.0), (3 / 4, 4 / 3), np.random.default_rng(0))
    ref = cv2.resize(img[top:top + h, left:left + w], (48, 48), interpolation=cv2.INTER_LINEAR)
    ref = ((ref - np.asarray(MEAN)) / np.asarray(STD)).transpose(2, 0, 1)
    out = t(img, np.random.default_rng(0))
    erased = np.all(out == 0, axis=0)
    assert 0.05 < erased.mean() < 0.3
    np.testing.assert_allclose(out[:, ~erased], ref[:, ~erased], atol=1e-5)


@pytest.mark.parametrize("cfg,match", [
    (dict(train_crop="center"), "train_crop"), (dict(interpolation="lanczos"), "interpolation"),
    (dict(crop_pct=1.5), "crop_pct"), (dict(rrc_scale=(0.5, 0.1)), "rrc_scale"),
    (dict(color_jitter=(0.4, 0.4)), "color_jitter"), (dict(auto_augment="rand-z1"), "auto_augment"),
    (dict(random_erasing=dict(prob=2.0)), "random_erasing")])
def test_bad_values_fail_with_the_key_name(cfg, match):
    with pytest.raises(DataError, match=match):
        build_sample_transform(cfg, True, MEAN, STD, 32)


def _check(**changes):
    flat = flatten(BaseConfig())
    flat.update(changes)
    check_values(flat)


def test_config_rules_accept_the_documented_values():
    _check(**{"data.train_crop": "random_resized", "data.auto_augment": "rand-m9-mstd0.5-inc1",
              "data.color_jitter": 0.4, "data.random_erasing.mode": "pixel", "data.mixup": 0.8,
              "data.cutmix": 1.0, "loss.name": "bce"})
    _check(**{"data.auto_augment": "autoaugment", "data.color_jitter": (0.4, 0.3, 0.2)})


@pytest.mark.parametrize("key,value,match", [
    ("data.auto_augment", "rand-m9-q1", "data.auto_augment"), ("data.color_jitter", -0.1, "color_jitter"),
    ("data.random_erasing.mode", "noise", "random_erasing.mode"), ("data.mix_prob", 1.5, "mix_prob"),
    ("data.rrc_ratio", (4 / 3, 3 / 4), "rrc_ratio"), ("data.random_erasing.area", (0.5, 0.1), "area"),
    ("loss.name", "focal", "loss.name"), ("data.interpolation", "lanczos", "interpolation")])
def test_config_rules_reject_bad_values_naming_the_key(key, value, match):
    with pytest.raises(CheckFailed, match=match):
        _check(**{key: value})
