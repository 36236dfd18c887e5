"""Channel shuffle (ShuffleNet): interleave channel groups so information crosses branches."""
from typing import Tuple

import megengine as mge
import megengine.functional as F

__all__ = ["channel_shuffle", "shuffle_split"]


def channel_shuffle(x: mge.Tensor, groups: int = 2) -> mge.Tensor:
    """(N, C, H, W) -> same shape with channel g*(C/groups)+i moved to i*groups+g.

    Args:
        x: (N, C, H, W), C a multiple of groups.
        groups: the channel groups.
    """
    n, c, h, w = x.shape
    if c % groups:
        raise ValueError(f"channel_shuffle: {c} channels do not split into {groups} groups")
    x = x.reshape(n, groups, c // groups, h, w)
    return F.transpose(x, (0, 2, 1, 3, 4)).reshape(n, c, h, w)


def shuffle_split(x: mge.Tensor) -> Tuple[mge.Tensor, mge.Tensor]:
    """ShuffleNetV2's channel shuffle fused with the next unit's split (Megvii's official code).

    Args:
        x: (N, C, H, W), C even.

    Returns:
        (even channels, odd channels) of `x`, each (N, C/2, H, W), in one reshape.
    """
    n, c, h, w = x.shape
    if c % 2:
        raise ValueError(f"shuffle_split: {c} channels is odd")
    x = x.reshape(n, c // 2, 2, h, w)
    return x[:, :, 0], x[:, :, 1]
