"""Which sample indices each rank sees in an epoch: plain sharding and repeated augmentation.

Both are pure functions of (n, seed, epoch, rank, world_size), so a resumed run and every worker
recompute the same plan. The permutation is ``np.random.default_rng([seed, epoch]).permutation(n)``.
Repeated augmentation follows timm's RepeatAugSampler / DeiT's RASampler: each permuted index is
repeated ``repeats`` times in a row, padded to a multiple of the world size, dealt out round-robin
(so the copies of an index land on different ranks), and each rank keeps the first
``floor(n // 256 * 256 / world_size)`` of its share (``n // world_size`` when n < 256), so an epoch
has about as many steps as without repetition while each chosen image is seen ``repeats`` times.
Class batches (``class_batch_indices``) build each batch from a few classes, in same-label groups; the rule is
in that function's docstring and docs/data.md.
"""

import math

import numpy as np

from .errors import DataError

__all__ = ["epoch_permutation", "shard_indices", "repeated_aug_indices", "repeated_aug_length",
           "class_group_size", "check_class_batches", "class_batch_indices"]

_SELECTED_ROUND = 256  # timm's selected_round: the epoch length is rounded down to a multiple of it
_CLASS_TAG = 0xC1A  # separates the class-batch plan's stream from the plain permutation ([seed, epoch])


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


def class_group_size(batch_size: int, classes_per_batch: int, examples_per_class=None) -> int:
    """``data.examples_per_class``: the size of a same-label group; None or 0 = ``batch_size // classes_per_batch``
    (each of the batch's classes as one group)."""
    return int(examples_per_class or batch_size // classes_per_batch)


def check_class_batches(labels: np.ndarray, batch_size: int, classes_per_batch: int, examples_per_class=None) -> None:
    """Raise DataError (one line) when a training split cannot give batches of ``classes_per_batch`` classes."""
    k = int(classes_per_batch)
    m = class_group_size(batch_size, k, examples_per_class) if k >= 1 else 0
    if k < 1 or m < 1 or batch_size % (k * m):
        raise DataError(f"data.classes_per_batch={k} x data.examples_per_class={m} must divide batch_size="
                        f"{batch_size}: each batch holds {k} classes, batch_size / {k} examples of each, in groups of "
                        f"{m} (data.examples_per_class None: batch_size / {k})")
    classes, counts = np.unique(np.asarray(labels), return_counts=True)
    if k > len(classes):
        raise DataError(f"data.classes_per_batch={k} but the training split holds {len(classes)} classes; set "
                        f"data.classes_per_batch to at most {len(classes)}")
    share = batch_size // k
    if share > counts.min():
        small = int(classes[np.argmin(counts)])
        raise DataError(f"data.classes_per_batch={k} takes {share} examples of each class into a batch of {batch_size} "
                        f"but class {small} has {int(counts.min())} training examples; raise data.classes_per_batch "
                        f"or lower batch_size")


def class_batch_indices(labels: np.ndarray, batch_size: int, classes_per_batch: int, examples_per_class,
                        seed: int, epoch: int, rank: int, world_size: int) -> np.ndarray:
    """Rank ``rank``'s sample indices for ``epoch``, batch after batch, each batch of ``classes_per_batch`` classes.

    The plan is global (every rank computes it from ``default_rng([_CLASS_TAG, seed, epoch])`` and keeps its own
    batches), with ``(len(labels) // world_size) // batch_size`` steps, as the plain sampler. Each class's indices
    are permuted and cut into blocks of ``q = batch_size // k`` (a class's examples in one batch); a step takes
    ``k * world_size`` distinct classes when the split has that many (rank r the r-th k of them: the ranks' batches
    hold different classes), else each rank's batch takes its own k distinct classes. Classes are drawn with
    probability proportional to their blocks left, constrained so that the blocks left always fill the remaining
    batches (so no block is used twice when the split's blocks suffice); a class whose blocks cannot cover the epoch
    is refilled with a fresh permutation of its indices first (the only way a sample repeats within an epoch; never
    within a batch, as ``q`` is at most the smallest class). In a batch, each class's block is split into groups of
    ``examples_per_class`` and the groups are put in random order, each group's examples next to each other.
    """
    labels = np.asarray(labels)
    k = int(classes_per_batch)
    m = class_group_size(batch_size, k, examples_per_class)
    q = batch_size // k
    steps = len(labels) // world_size // batch_size
    rng = np.random.default_rng([_CLASS_TAG, int(seed), int(epoch)])
    classes = np.unique(labels)
    members = [np.flatnonzero(labels == c) for c in classes]
    pools = [rng.permutation(idx) for idx in members]
    apart = k * world_size <= len(classes)  # one step's ranks take different classes
    width, units = (k * world_size, steps) if apart else (k, steps * world_size)
    blocks = np.array([len(p) // q for p in pools], np.int64)
    while np.minimum(blocks, units).sum() < width * units:  # refill the class with the fewest blocks
        c = int(np.argmin(blocks))  # whole blocks first, so that no block holds a sample twice
        pools[c] = np.concatenate([pools[c][:blocks[c] * q], rng.permutation(members[c])])
        blocks[c] = len(pools[c]) // q
    picks = _pick_classes(blocks, width, units, rng).reshape(steps, world_size, k)
    chosen = np.empty((steps, world_size, k, q), np.int64)
    flat_picks, flat_chosen = picks.reshape(-1), chosen.reshape(-1, q)
    for c, pool in enumerate(pools):  # a class's blocks in the order the plan takes them
        where = np.flatnonzero(flat_picks == c)
        flat_chosen[where] = pool[:len(where) * q].reshape(len(where), q)
    groups = chosen.reshape(steps, world_size, batch_size // m, m)
    order = rng.permuted(np.broadcast_to(np.arange(batch_size // m), groups.shape[:3]), axis=2)
    groups = np.take_along_axis(groups, order[..., None], axis=2)
    return groups[:, rank].reshape(-1)


def _pick_classes(blocks: np.ndarray, width: int, units: int, rng: np.random.Generator) -> np.ndarray:
    """(units, width) class positions, each row distinct, class c in at most ``blocks[c]`` rows; needs
    sum(min(blocks, units)) >= width * units. Before each row with R rows left, the classes with >= R blocks
    ("hot") must be taken often enough to keep sum(min(blocks, R - 1)) >= width * (R - 1): at least
    hot - (sum(min(blocks, R)) - width * R) of them."""
    left = blocks.astype(np.int64).copy()
    out = np.empty((units, width), np.int64)
    for t in range(units):
        rows_left = units - t
        hot = np.flatnonzero(left >= rows_left)
        need = max(0, len(hot) - int(np.minimum(left, rows_left).sum() - width * rows_left))
        forced = _draw(rng, hot, need, left)
        row = rng.permutation(np.concatenate([forced, _draw(rng, np.setdiff1d(np.flatnonzero(left), forced),
                                                                width - need, left)]))
        left[row] -= 1
        out[t] = row
    return out


def _draw(rng: np.random.Generator, candidates: np.ndarray, size: int, weights: np.ndarray) -> np.ndarray:
    """``size`` distinct of ``candidates``, drawn one after another with probability proportional to the weights
    (Efraimidis-Spirakis: the ``size`` largest keys ``u ** (1 / weight)``, compared as ``log(u) / weight``)."""
    if size == 0:
        return candidates[:0]
    keys = np.log1p(-rng.random(len(candidates))) / weights[candidates]
    return candidates[np.argsort(-keys, kind="stable")[:size]]
