"""Class batches (data.classes_per_batch / data.examples_per_class): each training batch holds exactly k classes
in same-label groups, the plan is fixed by (seed, epoch), a resumed run draws the same batches, no sample twice
per epoch while the classes allow it, and the refusals are one line.

The datasets' images name their own sample (pixel values = the index in base 256), so every check reads the index
and the label from what the loader yields and compares them with the dataset, never with the sampler's plan."""
import numpy as np
import pytest

from basebn.config import ConfigError, load_config
from basebn.data import BatchLoader, DataError, build_dataset, build_loader
from basebn.data.base import ArrayDataset
from basebn.engine.build import build_precise_bn_data
from tests.support.cli import TINY, run, write_config


def tagged_dataset(labels, num_classes=None):
    """An in-memory dataset whose image i holds i in its pixels (2 x 2, one channel: i // 256, i % 256, 0, 0)."""
    labels = np.asarray(labels)
    n = len(labels)
    images = np.zeros((n, 2, 2, 1), np.uint8)
    images[:, 0, 0, 0], images[:, 0, 1, 0] = np.arange(n) // 256, np.arange(n) % 256
    return ArrayDataset(images, labels, name="tagged", num_classes=num_classes or int(labels.max()) + 1,
                        mean=(0.0,), std=(1.0,), default_pad=0, default_hflip=False)


def loader_for(ds, batch, k, m=None, seed=5, rank=0, world=1, **kw):
    return BatchLoader(ds, batch, train=True, seed=seed, rank=rank, world_size=world, pad=0, hflip=False,
                       prefetch=0, classes_per_batch=k, examples_per_class=m, **kw)


def yielded(loader, epoch):
    """[(sample indices read from the images, labels as yielded)] of one epoch."""
    loader.set_epoch(epoch)
    out = []
    for x, y in loader:
        index = (x[:, 0, 0, 0] * 256 + x[:, 0, 0, 1]).round().astype(np.int64)
        out.append((index, y.copy()))
    return out


def balanced_labels(classes, per_class, seed=0):
    labels = np.repeat(np.arange(classes), per_class)
    return np.random.default_rng(seed).permutation(labels)


@pytest.mark.parametrize("batch, k, m", [(8, 4, 2), (8, 2, None), (12, 3, 2), (16, 2, 4), (6, 6, 1)])
def test_each_batch_holds_k_classes_in_same_label_groups(batch, k, m):
    labels = balanced_labels(6, 24)
    ds = tagged_dataset(labels)
    loader = loader_for(ds, batch, k, m)
    assert len(loader) == len(labels) // batch  # the plain sampler's epoch length
    group = m or batch // k
    for epoch in (0, 3):
        batches = yielded(loader, epoch)
        assert len(batches) == len(labels) // batch
        for index, y in batches:
            np.testing.assert_array_equal(y, labels[index])  # the yielded labels are the samples' own
            values, counts = np.unique(y, return_counts=True)
            assert len(values) == k and (counts == batch // k).all()
            groups = y.reshape(batch // group, group)
            assert (groups == groups[:, :1]).all()  # each group's examples side by side, one label


def test_no_sample_twice_per_epoch_and_every_sample_once_when_the_split_divides():
    labels = balanced_labels(5, 24)  # 120 samples, batch 8 of 2 classes: 15 batches use every sample once
    ds = tagged_dataset(labels)
    for seed in range(4):
        seen = np.concatenate([i for i, _ in yielded(loader_for(ds, 8, 2, seed=seed), seed)])
        assert sorted(seen.tolist()) == list(range(120))


def test_unbalanced_classes_still_used_once_when_they_can_fill_the_epoch():
    # 30 of class 0, 10 each of 1..3; batch 4 = 2 classes x 2: class 0 must be in every one of the 15 batches
    labels = np.random.default_rng(1).permutation(np.repeat([0, 1, 2, 3], [30, 10, 10, 10]))
    ds = tagged_dataset(labels)
    for seed in range(6):
        batches = yielded(loader_for(ds, 4, 2, seed=seed), seed)
        seen = np.concatenate([i for i, _ in batches])
        assert sorted(seen.tolist()) == list(range(60))
        assert all(len(np.unique(y)) == 2 for _, y in batches)


def test_classes_too_small_for_the_epoch_are_refilled_and_only_they_repeat():
    # 63 samples, batch 6 = 2 classes x 3: class 0 can be in each of the 10 batches once, classes 1-3 hold 4
    # blocks of 3 for the other 10 places: they are refilled with fresh permutations, and only their samples repeat
    labels = np.random.default_rng(2).permutation(np.repeat([0, 1, 2, 3], [50, 5, 5, 3]))
    ds = tagged_dataset(labels)
    for seed in range(4):
        batches = yielded(loader_for(ds, 6, 2, seed=seed), 0)
        assert len(batches) == 10
        for index, y in batches:
            np.testing.assert_array_equal(y, labels[index])
            assert len(np.unique(index)) == 6  # a refilled class's blocks never straddle two of its permutations
            values, counts = np.unique(y, return_counts=True)
            assert len(values) == 2 and (counts == 3).all()
        seen = np.concatenate([i for i, _ in batches])
        values, counts = np.unique(seen, return_counts=True)
        assert (counts[labels[values] == 0] == 1).all()
        assert (counts > 1).any()


def test_same_seed_same_batches_other_seed_or_epoch_other_batches():
    ds = tagged_dataset(balanced_labels(6, 20))
    a, b = yielded(loader_for(ds, 8, 2, seed=11), 2), yielded(loader_for(ds, 8, 2, seed=11), 2)
    assert [i.tolist() for i, _ in a] == [i.tolist() for i, _ in b]
    for other in (yielded(loader_for(ds, 8, 2, seed=12), 2), yielded(loader_for(ds, 8, 2, seed=11), 3)):
        assert [i.tolist() for i, _ in a] != [i.tolist() for i, _ in other]


def test_the_plain_sampler_is_unchanged_when_off():
    ds = tagged_dataset(balanced_labels(6, 20))
    off = BatchLoader(ds, 8, train=True, seed=4, pad=0, hflip=False, prefetch=0)
    off.set_epoch(1)
    expected = np.random.default_rng([4, 1]).permutation(len(ds))[:len(off) * 8]  # docs/data.md's permutation
    np.testing.assert_array_equal(np.concatenate([i for i, _ in yielded(off, 1)]), expected)


def test_resume_at_an_epoch_boundary_draws_the_uninterrupted_batches():
    """A resumed run builds its loader from the config anew and starts at the next epoch (checkpoints are written
    at epoch ends); workers build batches in other processes. Both must see what one long run sees."""
    cfg = dict(name="synthetic", image_size=8, train_size=120, pad=1, classes_per_batch=2, examples_per_class=2,
               prefetch=0)
    ds = build_dataset(cfg, train=True)

    def epoch_batches(loader, epoch):
        loader.set_epoch(epoch)
        return [(x.copy(), y.copy()) for x, y in loader]

    whole = build_loader(cfg, ds, 8, train=True, seed=9)
    first, second = epoch_batches(whole, 0), epoch_batches(whole, 1)
    resumed = build_loader(cfg, ds, 8, train=True, seed=9)
    workers = build_loader(dict(cfg, num_workers=2), ds, 8, train=True, seed=9)
    try:
        for again in (epoch_batches(resumed, 1), epoch_batches(workers, 1)):
            assert len(again) == len(second) == 120 // 8
            for (x1, y1), (x2, y2) in zip(second, again):
                np.testing.assert_array_equal(x1, x2)
                np.testing.assert_array_equal(y1, y2)
    finally:
        workers.close()
    for _, y in first + second:
        values, counts = np.unique(y, return_counts=True)
        assert len(values) == 2 and (counts == 4).all()
        assert (y.reshape(4, 2)[:, 0] == y.reshape(4, 2)[:, 1]).all()


def test_ranks_of_a_step_take_different_classes_and_share_the_epoch():
    labels = balanced_labels(4, 24)
    ds = tagged_dataset(labels)
    ranks = [yielded(loader_for(ds, 6, 1, rank=r, world=2), 1) for r in range(2)]
    assert len(ranks[0]) == len(ranks[1]) == 96 // 2 // 6
    for (i0, y0), (i1, y1) in zip(*ranks):
        np.testing.assert_array_equal(y0, labels[i0])
        np.testing.assert_array_equal(y1, labels[i1])
        assert len(np.unique(y0)) == len(np.unique(y1)) == 1 and y0[0] != y1[0]
    seen = np.concatenate([i for rank in ranks for i, _ in rank])
    assert sorted(seen.tolist()) == list(range(96))
    # more classes per step than the split holds: each rank's batch still has its own k distinct classes
    wide = [yielded(loader_for(ds, 6, 3, rank=r, world=2), 0) for r in range(2)]
    assert all(len(np.unique(y)) == 3 for rank in wide for _, y in rank)


def test_split_refusals_are_one_line_data_errors():
    ds = tagged_dataset(np.repeat([0, 1, 2], [20, 20, 3]), num_classes=10)
    with pytest.raises(DataError, match=r"^data.classes_per_batch=4 but the training split holds 3 classes") as e:
        loader_for(ds, 8, 4, 2)
    with pytest.raises(DataError, match=r"takes 4 examples of each class .* class 2 has 3 training examples") as e:
        loader_for(ds, 8, 2)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="repeated_aug"):
        loader_for(tagged_dataset(balanced_labels(3, 10)), 6, 3, repeated_aug=2)


@pytest.mark.parametrize("overrides, message", [
    (["data.classes_per_batch=11"], "data.classes_per_batch=11 is more than the num_classes=10 classes"),
    (["data.classes_per_batch=4", "batch_size=2"], "data.classes_per_batch=4 is more than batch_size=2"),
    (["data.classes_per_batch=3", "batch_size=16"], "data.classes_per_batch=3 must divide batch_size=16"),
    (["data.classes_per_batch=2", "data.examples_per_class=3", "batch_size=16"],
     "data.classes_per_batch=2 x data.examples_per_class=3 = 6 must divide batch_size=16"),
    (["data.classes_per_batch=2", "data.repeated_aug=3"], "cannot be combined with data.repeated_aug=3"),
    (["data.examples_per_class=2"], "data.examples_per_class=2 applies to class batches only"),
])
def test_config_refusals_are_one_line(tmp_path, overrides, message):
    path = write_config(tmp_path, TINY)
    with pytest.raises(ConfigError) as e:
        load_config(path, overrides)
    assert message in str(e.value) and "\n" not in str(e.value)
    assert load_config(path, ["data.classes_per_batch=2", "data.examples_per_class=2"]).data.classes_per_batch == 2


def test_cli_refuses_a_class_smaller_than_its_batch_share_in_one_line(tmp_path):
    # TINY: 96 synthetic training images over 10 classes, batch 16: one class per batch needs 16 of a class
    path = write_config(tmp_path, TINY)
    r = run(["basebn.train", path, f"output_dir={tmp_path / 'run'}", "data.classes_per_batch=1"])
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "classes_per_batch=1 takes 16 examples of each class" in errors[0], r.stderr


def test_precise_bn_pass_keeps_iid_batches(tmp_path):
    """Precise BN estimates population statistics, and its batch size need not fit the class-batch rule."""
    cfg = load_config(write_config(tmp_path, TINY), ["data.classes_per_batch=2", "data.examples_per_class=2",
                                                     "bn.precise_batch_size=10"])
    ds, loader = build_precise_bn_data(cfg)
    assert loader.classes_per_batch == 0 and len(loader) == len(ds) // 10
    loader.set_epoch(0)
    assert max(len(np.unique(y)) for _, y in loader) > 2
