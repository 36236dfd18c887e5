import math
import os

import numpy as np
import pytest

from basebn.config import BaseConfig, load_config
from basebn.engine.lr_schedule import FREEZE_LR_FRACTION, PEAK_FRACTION, freeze_warning, lr_at, schedule_warning


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


def closed_form_peak(max_epoch, warmup_epochs, warmup_factor, points=200_001):
    """The highest cosine-with-warm-up factor over the run (lr_min 0), from the formula on a fine numpy grid."""
    t = np.linspace(0.0, max_epoch, points)
    alpha = np.minimum(t / warmup_epochs, 1.0)
    return float(np.max(0.5 * (1 + np.cos(np.pi * t / max_epoch)) * (warmup_factor * (1 - alpha) + alpha)))


def test_warmup_as_long_as_the_run_is_one_warning_line(repo_root):
    cfg = load_config(os.path.join(repo_root, "configs", "imagenet_resnet50.py"), ["solver.max_epoch=2"])
    line = schedule_warning(cfg.solver, cfg.solver.basic_lr)
    peak = closed_form_peak(2, 5, 0.1)
    assert line is not None and "\n" not in line
    assert line.startswith("solver.warmup_epochs=5 >= solver.max_epoch=2: the warm-up never ends")
    assert f"{peak:.0%} of its base 0.025" in line and f"peaks at {0.025 * peak:.3g}" in line


def test_a_peak_far_below_the_base_lr_is_one_warning_line():
    s = solver(lr_schedule="cosine", max_epoch=8, warmup_epochs=5, warmup_factor=0.1, lr_min_factor=0.0)
    peak = closed_form_peak(8, 5, 0.1)
    assert peak < PEAK_FRACTION
    line = schedule_warning(s, 1.0)
    assert line is not None and "\n" not in line and f"({peak:.0%} of its base 1)" in line
    assert "solver.warmup_epochs=5" in line and "solver.max_epoch=8" in line


@pytest.mark.parametrize("overrides", [[], ["solver.max_epoch=10"]])
def test_the_shipped_recipe_gets_no_warning(repo_root, overrides):
    cfg = load_config(os.path.join(repo_root, "configs", "imagenet_resnet50.py"), overrides)
    assert closed_form_peak(cfg.solver.max_epoch, 5, 0.1) >= PEAK_FRACTION
    assert schedule_warning(cfg.solver, cfg.solver.basic_lr) is None


def test_no_warmup_effect_means_no_warning():
    # warmup_factor 1: the "warm-up" starts at the base lr, so the run reaches it whatever its length
    assert schedule_warning(solver(max_epoch=2, warmup_epochs=5, warmup_factor=1.0), 0.1) is None
    assert schedule_warning(solver(max_epoch=2, warmup_epochs=0), 0.1) is None


def test_freeze_warning_speaks_only_when_the_frozen_epochs_run_above_a_hundredth_of_the_peak():
    assert FREEZE_LR_FRACTION == 0.01
    # step x0.1 at epochs 2 and 3 of 4: the last epoch runs at exactly 1/100 of the peak (closed form 0.1 ** 2)
    step = solver(lr_schedule="step", max_epoch=4, warmup_epochs=0.4, lr_decay_steps=(2, 3), lr_decay_factor=0.1)
    assert freeze_warning(step, 1, 0.1) is None
    assert freeze_warning(step, 0, 0.1) is None  # off
    # two frozen epochs include epoch 3 at 1/10 of the peak
    two = freeze_warning(step, 2, 0.1)
    assert two and "bn.freeze_last_epochs=2" in two and "0.01," in two and "0.1 of the peak 0.1" in two
    # cosine over 4 epochs: the last epoch starts at (1 + cos(3 pi / 4)) / 2 = 0.146 of the peak
    cosine = solver(lr_schedule="cosine", max_epoch=4, warmup_epochs=0.4, lr_min_factor=0.0)
    text = freeze_warning(cosine, 1, 0.4)
    assert text and f"{0.4 * (1 + math.cos(3 * math.pi / 4)) / 2:.3g}" in text and "bn.freeze_last_epochs=0" in text
