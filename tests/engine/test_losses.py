"""basebn.engine.losses against numpy written from the math (float64)."""

import megengine as mge
import numpy as np
import pytest

from basebn.config import BaseConfig, ConfigError
from basebn.engine.losses import build_loss


def _log_softmax(x):
    x = x - x.max(1, keepdims=True)
    return x - np.log(np.exp(x).sum(1, keepdims=True))


def _loss(name, smooth, logits, targets):
    cfg = BaseConfig()
    cfg.loss.name, cfg.loss.label_smooth = name, smooth
    return float(build_loss(cfg)(mge.tensor(logits), mge.tensor(targets)).item())


def _data(b=6, k=5, seed=0, scale=3.0):
    r = np.random.default_rng(seed)
    logits = (r.standard_normal((b, k)) * scale).astype(np.float32)
    labels = r.integers(0, k, b).astype(np.int32)
    soft = r.random((b, k)).astype(np.float32)
    return logits, labels, soft / soft.sum(1, keepdims=True)


@pytest.mark.parametrize("smooth", [0.0, 0.1])
def test_cross_entropy_hard_labels_with_label_smoothing(smooth):
    logits, labels, _ = _data()
    lp = _log_softmax(logits.astype(np.float64))
    k = logits.shape[1]
    ref = -((1 - smooth) * lp[np.arange(len(labels)), labels] + smooth / k * lp.sum(1)).mean()
    assert _loss("ce", smooth, logits, labels) == pytest.approx(ref, rel=1e-5)


def test_cross_entropy_soft_targets():
    logits, labels, soft = _data()
    ref = -(soft * _log_softmax(logits.astype(np.float64))).sum(1).mean()
    assert _loss("ce", 0.0, logits, soft) == pytest.approx(ref, rel=1e-5)
    # soft targets are taken as given: loss.label_smooth does not smooth them again
    assert _loss("ce", 0.3, logits, soft) == pytest.approx(ref, rel=1e-5)


def _bce_ref(x, t):
    x = x.astype(np.float64)
    return (np.logaddexp(0, x) - x * t).mean()  # -(t log s(x) + (1 - t) log(1 - s(x)))


@pytest.mark.parametrize("smooth", [0.0, 0.2])
def test_bce_hard_labels_are_smoothed_one_hot(smooth):
    logits, labels, _ = _data()
    k = logits.shape[1]
    t = np.full(logits.shape, smooth / k)
    t[np.arange(len(labels)), labels] = 1 - smooth + smooth / k
    assert _loss("bce", smooth, logits, labels) == pytest.approx(_bce_ref(logits, t), rel=1e-5)


def test_bce_soft_targets_and_large_logits_stay_finite():
    logits, _, soft = _data(scale=40.0)
    got = _loss("bce", 0.0, logits, soft)
    assert np.isfinite(got) and got == pytest.approx(_bce_ref(logits, soft), rel=1e-5)


def test_unknown_loss_name_is_a_config_error():
    cfg = BaseConfig()
    cfg.loss.name = "focal"
    with pytest.raises(ConfigError, match="loss.name"):
        build_loss(cfg)
