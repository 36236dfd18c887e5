"""Channel-count rounding used by MobileNet/EfficientNet width multipliers and SE widths."""

from typing import Optional

__all__ = ["make_divisible"]


def make_divisible(value: float, divisor: int = 8, min_value: Optional[int] = None, round_limit: float = 0.0) -> int:
    """`value` rounded to the nearest multiple of `divisor`; one more `divisor` when rounding lost more than
    `1 - round_limit` of it (timm / basecls rule).

    Args:
        value: a channel count, e.g. width x multiplier.
        divisor: the multiple.
        min_value: the least result; None: `divisor`.
        round_limit: 0 (never add one more) to 1.
    """
    min_value = min_value or divisor
    new_value = max(min_value, int(value + divisor / 2) // divisor * divisor)
    if new_value < round_limit * value:
        new_value += divisor
    return new_value
