import math

import pytest

from basebn.config import BaseConfig
from basebn.engine.lr_schedule import lr_at


def solver(**kw):
    s = BaseConfig().solver
    s.merge(kw)
    return s


def test_cosine_with_warmup_closed_form():
    s = solver(lr_schedule="cosine", max_epoch=10, warmup_epochs=2, warmup_factor=0.1, lr_min_factor=0.0)
    ipe = 50
    # iteration 0: warm-up starts at warmup_factor * cosine(0) = 0.1
    assert lr_at(0, ipe, s, 1.0) == pytest.approx(0.1)
    # mid warm-up, t = 1 epoch: alpha = 0.5 -> factor 0.55 times cos term
    cos1 = 0.5 * (1 + math.cos(math.pi * 1 / 10))
    assert lr_at(50, ipe, s, 2.0) == pytest.approx(2.0 * cos1 * 0.55)
    # after warm-up, t = 5: pure cosine
    assert lr_at(250, ipe, s, 1.0) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.5)))
    # end
    assert lr_at(499, ipe, s, 1.0) == pytest.approx(0.5 * (1 + math.cos(math.pi * 499 / 500)))


def test_cosine_floor():
    s = solver(lr_schedule="cosine", max_epoch=4, warmup_epochs=0, lr_min_factor=0.2)
    assert lr_at(400, 100, s, 1.0) == pytest.approx(0.2)


def test_step_schedule():
    s = solver(lr_schedule="step", max_epoch=10, warmup_epochs=0, lr_decay_steps=(3, 6), lr_decay_factor=0.1)
    assert lr_at(299, 100, s, 1.0) == pytest.approx(1.0)
    assert lr_at(300, 100, s, 1.0) == pytest.approx(0.1)
    assert lr_at(650, 100, s, 1.0) == pytest.approx(0.01)


def test_linear_schedule():
    s = solver(lr_schedule="linear", max_epoch=5, warmup_epochs=0, lr_min_factor=0.0)
    assert lr_at(250, 100, s, 1.0) == pytest.approx(0.5)
