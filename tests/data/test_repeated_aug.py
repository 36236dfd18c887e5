"""Repeated augmentation (data.repeated_aug=N): timm's RepeatAugSampler plan, each chosen index N times per
epoch over the ranks, on different ranks, with different augmentations."""
import math

import numpy as np
import pytest

from basebn.data import BatchLoader, SyntheticShapes
from basebn.data.sampler import repeated_aug_indices, repeated_aug_length


def timm_repeat_aug(perm, num_repeats, num_replicas, rank, selected_round=256):
    """timm.data.distributed_sampler.RepeatAugSampler.__iter__, transcribed with lists (perm given)."""
    n = len(perm)
    num_samples = int(math.ceil(n * num_repeats / num_replicas))
    total_size = num_samples * num_replicas
    if selected_round:
        num_selected = int(math.floor(n // selected_round * selected_round / num_replicas))
    else:
        num_selected = int(math.ceil(n / num_replicas))
    indices = [i for i in perm for _ in range(num_repeats)]
    padding = total_size - len(indices)
    if padding > 0:
        indices += indices[:padding]
    assert len(indices) == total_size
    indices = indices[rank:total_size:num_replicas]
    return indices[:num_selected]


@pytest.mark.parametrize("n, world, repeats", [(1000, 4, 3), (600, 2, 3), (513, 3, 2), (300, 8, 4)])
def test_plan_equals_timm_and_each_index_n_times_over_ranks(n, world, repeats):
    perm = np.random.default_rng([11, 5]).permutation(n)
    plans = [repeated_aug_indices(n, 11, 5, r, world, repeats) for r in range(world)]
    for r, plan in enumerate(plans):
        assert plan.tolist() == timm_repeat_aug(perm.tolist(), repeats, world, r)
        assert len(plan) == repeated_aug_length(n, world) == n // 256 * 256 // world
    merged = np.stack(plans, axis=1).reshape(-1)  # the order they were dealt in
    values, counts = np.unique(merged, return_counts=True)
    whole = len(merged) // repeats  # indices whose copies were all dealt before the epoch's cut
    complete = merged[:whole * repeats].reshape(whole, repeats)
    assert (complete == complete[:, :1]).all()  # each index N times in a row ...
    assert (counts[np.isin(values, complete[:, 0])] == repeats).all()  # ... and nowhere else
    if repeats <= world:  # consecutive copies go to consecutive ranks: never twice on one rank
        for r, plan in enumerate(plans):
            assert len(np.unique(plan[np.isin(plan, complete[:, 0])])) == np.isin(plan, complete[:, 0]).sum()


def test_small_dataset_keeps_n_over_world_per_rank():
    plans = [repeated_aug_indices(90, 0, 0, r, 3, 3) for r in range(3)]
    assert [len(p) for p in plans] == [30, 30, 30]
    values, counts = np.unique(np.concatenate(plans), return_counts=True)
    assert len(values) == 30 and (counts == 3).all()  # 90 slots = 30 indices x 3 copies


def test_loader_with_repeated_aug_gives_copies_different_augmentations():
    ds = SyntheticShapes(train=True, image_size=12, size=60, seed=0)
    loaders = [BatchLoader(ds, 10, train=True, seed=4, rank=r, world_size=2, pad=3, repeated_aug=2, prefetch=0)
               for r in range(2)]
    assert [len(ld) for ld in loaders] == [3, 3]
    images = {}
    for ld in loaders:
        ld.set_epoch(1)
        for (x, y), idx in zip(ld, ld.batch_indices()):
            np.testing.assert_array_equal(y, ds.labels[idx])
            for xi, i in zip(x, idx):
                images.setdefault(int(i), []).append(xi)
    assert all(len(v) == 2 for v in images.values()) and len(images) == 30
    differ = sum(not np.array_equal(*v) for v in images.values())
    assert differ >= 25  # pad-crop 7x7 offsets x flip: two equal draws are rare
    # without repetition each rank sees distinct images
    plain = BatchLoader(ds, 10, train=True, seed=4, world_size=2, pad=3, prefetch=0)
    assert len(np.unique(np.concatenate(plain.batch_indices(1)))) == 30
