"""Channel-count rounding used by MobileNet/EfficientNet width multipliers and SE widths."""

__all__ = ["make_divisible"]


def make_divisible(value, divisor=8, min_value=None, round_limit=0.0):
    """`value` rounded to the nearest multiple of `divisor` (at least `min_value`, default `divisor`);
    one more `divisor` when rounding lost more than `1 - round_limit` of it (timm / basecls rule)."""
    min_value = min_value or divisor
    new_value = max(min_value, int(value + divisor / 2) // divisor * divisor)
    if new_value < round_limit * value:
        new_value += divisor
    return new_value
