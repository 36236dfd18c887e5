"""Classification losses for hard labels (B,) or soft targets (B, K) (Mixup/CutMix): cross-entropy or BCE.

``build_loss(cfg)`` reads ``loss.name`` ("ce" | "bce") and ``loss.label_smooth``. Smoothing is
applied to hard labels only: soft targets come from the mixer, which has already smoothed them.
Both losses average over the batch; BCE (timm's BinaryCrossEntropy) averages over B x K.
"""
from typing import Any, Callable

import megengine.functional as F

from ..config import ConfigError

__all__ = ["LOSS_NAMES", "CrossEntropyLoss", "BinaryCrossEntropyLoss", "build_loss"]

LOSS_NAMES = ("ce", "bce")
"""The losses build_loss builds (``loss.name``)."""


def _smoothed_one_hot(labels, num_classes: int, smoothing: float):
    off = smoothing / num_classes
    return F.one_hot(labels.astype("int32"), num_classes).astype("float32") * (1.0 - smoothing) + off


class CrossEntropyLoss:
    """Softmax cross-entropy: int labels (with label smoothing) or soft targets ``-sum(t * log p)``.

    Args:
        label_smooth: the smoothing of hard labels.
    """

    def __init__(self, label_smooth: float = 0.0):
        self.label_smooth = float(label_smooth)

    def __call__(self, logits, targets):
        if targets.ndim == 2:
            return -(targets * F.logsoftmax(logits, axis=1)).sum(axis=1).mean()
        return F.nn.cross_entropy(logits, targets, label_smooth=self.label_smooth)


class BinaryCrossEntropyLoss:
    """Sigmoid BCE per class, mean over B x K, in the stable form max(x, 0) - x t + log(1 + e^-|x|).

    Args:
        label_smooth: the smoothing of hard labels.
    """

    def __init__(self, label_smooth: float = 0.0):
        self.label_smooth = float(label_smooth)

    def __call__(self, logits, targets):
        if targets.ndim != 2:
            targets = _smoothed_one_hot(targets, logits.shape[1], self.label_smooth)
        x = logits
        return (F.relu(x) - x * targets + F.log1p(F.exp(-F.abs(x)))).mean()


def build_loss(cfg: Any) -> Callable[..., Any]:
    """The loss ``(logits, targets) -> scalar`` for ``cfg.loss`` (name, label_smooth).

    Args:
        cfg: the config (its loss section).

    Raises:
        ConfigError: an unknown loss.name.
    """
    loss_cfg = cfg.loss
    name = loss_cfg.get("name", "ce") if hasattr(loss_cfg, "get") else getattr(loss_cfg, "name", "ce")
    smooth = loss_cfg.get("label_smooth", 0.0) if hasattr(loss_cfg, "get") else loss_cfg.label_smooth
    if name == "ce":
        return CrossEntropyLoss(smooth)
    if name == "bce":
        return BinaryCrossEntropyLoss(smooth)
    raise ConfigError(f"config key 'loss.name' must be one of {LOSS_NAMES}, got {name!r}")
