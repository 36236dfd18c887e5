"""Squeeze-and-excitation: x * gate(fc2(act(fc1(mean_hw(x))))), with basecls's module names.

State-dict keys follow basecls's ``SE``: ``f_ex.0`` (reduce 1x1 conv, bias) and ``f_ex.2`` (expand
1x1 conv, bias). The squeezed width differs between basecls families; :func:`se_width` applies
the rule, and each family passes its own reference width:

============  =====================  ================================
family        reference width        rule
============  =====================  ================================
ResNet        block output           "divisible": make_divisible(w*r)
RegNet        block input            "round": round(w*r)
MobileNetV3   expanded (mid) width   "divisible_0.9": make_divisible(w*r, round_limit=0.9)
EfficientNet  block input            "floor": int(w*r)
RepVGG        block output           "floor"
ShuffleNetV2  main-branch output     "floor"
============  =====================  ================================
"""
from typing import Optional

import megengine.module as M

from .activation import build_activation
from .divisible import make_divisible
from .pooling import GlobalAvgPool2d

__all__ = ["SqueezeExcite", "SE_WIDTH_RULES", "se_width"]

SE_WIDTH_RULES = {
    "divisible": lambda w, r: make_divisible(w * r),
    "divisible_0.9": lambda w, r: make_divisible(w * r, round_limit=0.9),
    "round": lambda w, r: int(round(w * r)),
    "floor": lambda w, r: int(w * r),
}
"""SE width rule name -> ``(width, ratio) -> squeezed width`` (which family uses which: the module doc)."""


def se_width(width: int, ratio: float, rule: str) -> int:
    """Squeezed width for `width` channels at `ratio` under `rule`; 0 if ratio <= 0.

    Args:
        width: the channels the ratio applies to.
        ratio: the squeeze ratio.
        rule: a key of SE_WIDTH_RULES.

    Raises:
        ValueError: an unknown rule.
    """
    if ratio <= 0:
        return 0
    if rule not in SE_WIDTH_RULES:
        raise ValueError(f"unknown SE width rule {rule!r}: use one of {', '.join(SE_WIDTH_RULES)}")
    return SE_WIDTH_RULES[rule](width, ratio)


class SqueezeExcite(M.Module):
    """SE block on `channels` channels squeezed to `squeeze_channels`; `act` inside, sigmoid gate
    (hard sigmoid with `hard_gate`, as MobileNetV3).

    Args:
        channels: input and output channels.
        squeeze_channels: the squeezed width (see se_width).
        act: the activation between the two 1x1 convs (a build_activation name).
        hard_gate: a hard sigmoid gate instead of a sigmoid.
    """

    def __init__(self, channels: int, squeeze_channels: int, act: Optional[str] = "relu", hard_gate: bool = False):
        super().__init__()
        self.avg_pool = GlobalAvgPool2d()
        self.f_ex = M.Sequential(
            M.Conv2d(channels, squeeze_channels, 1, bias=True),
            build_activation(act),
            M.Conv2d(squeeze_channels, channels, 1, bias=True),
            build_activation("hsigmoid" if hard_gate else "sigmoid"),
        )

    def forward(self, x):
        return x * self.f_ex(self.avg_pool(x))
