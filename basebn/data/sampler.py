"""Which sample indices each rank sees in an epoch: plain sharding and repeated augmentation.

Both are pure functions of (n, seed, epoch, rank, world_size), so a resumed run and every worker
recompute the same plan. The permutation is ``np.random.default_rng([seed, epoch]).permutation(n)``.
Repeated augmentation follows timm's RepeatAugSampler / DeiT's RASampler: each permuted index is
repeated ``repeats`` times in a row, padded to a multiple of the world size, dealt out round-robin
(so the copies of an index land on different ranks), and each rank keeps the first
``floor(n // 256 * 256 / world_size)`` of its share (``n // world_size`` when n < 256), so an epoch
has about as many steps as without repetition while each chosen image is seen ``repeats`` times.
"""

import math

import numpy as np

__all__ = ["epoch_permutation", "shard_indices", "repeated_aug_indices", "repeated_aug_length"]

_SELECTED_ROUND = 256  # timm's selected_round: the epoch length is rounded down to a multiple of it


def epoch_permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    """The shuffled order of ``range(n)`` for ``epoch``."""
    return np.random.default_rng([int(seed), int(epoch)]).permutation(n)


def shard_indices(n: int, seed: int, epoch: int, rank: int, world_size: int) -> np.ndarray:
    """Rank ``rank``'s contiguous slice (``n // world_size`` indices) of the epoch's permutation."""
    m = n // world_size
    return epoch_permutation(n, seed, epoch)[rank * m:(rank + 1) * m]


def repeated_aug_length(n: int, world_size: int) -> int:
    """Indices per rank and epoch with repeated augmentation (timm's ``num_selected_samples``)."""
    if n >= _SELECTED_ROUND:
        return int(math.floor(n // _SELECTED_ROUND * _SELECTED_ROUND / world_size))
    return n // world_size


def repeated_aug_indices(n: int, seed: int, epoch: int, rank: int, world_size: int,
                         repeats: int) -> np.ndarray:
    """Rank ``rank``'s indices for ``epoch``: each permuted index ``repeats`` times, dealt round-robin."""
    repeated = np.repeat(epoch_permutation(n, seed, epoch), int(repeats))
    per_rank = -(-len(repeated) // world_size)
    total = per_rank * world_size
    if total > len(repeated):  # pad with the start, as timm does, so every rank has per_rank
        repeated = np.concatenate([repeated, repeated[:total - len(repeated)]])
    return repeated[rank:total:world_size][:repeated_aug_length(n, world_size)]
