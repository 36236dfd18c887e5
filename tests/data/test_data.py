"""Tests for basebn.data: parsers, augmentations, loader determinism/sharding, validation."""

import gzip
import os
import pickle
import threading

import cv2
import numpy as np
import pytest

from basebn.data import (CIFAR10, CIFAR100, DATASET_NAMES, MNIST, Adapted, ArrayDataset,
                         BatchLoader, DataError, FashionMNIST, ImageFolder, Subset, SyntheticShapes,
                         build_dataset, build_loader, crop_flip, normalize, random_crop,
                         random_hflip, read_idx, sample_crop_flip, validate_dataset, write_idx)
from basebn.data.idx import FASHION_MNIST_DEFAULT_ROOT


def _rng(seed=0):
    return np.random.default_rng(seed)


def _tiny(n=30, h=6, w=5, c=1, classes=3, seed=0):
    r = _rng(seed)
    images = r.integers(0, 256, (n, h, w, c), dtype=np.uint8)
    labels = np.arange(n) % classes
    return ArrayDataset(images, labels, name="tiny", num_classes=classes, mean=(0.0,) * c,
                        std=(1.0,) * c)


# ------------------------------------------------------------------------------------ IDX
def _write_mnist(root, n_train=7, n_test=3, gz=True):
    os.makedirs(root, exist_ok=True)
    r = _rng(1)
    out = {}
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        x = r.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        y = r.integers(0, 10, n).astype(np.uint8)
        ext = ".gz" if gz else ""
        write_idx(os.path.join(root, f"{prefix}-images-idx3-ubyte{ext}"), x)
        write_idx(os.path.join(root, f"{prefix}-labels-idx1-ubyte{ext}"), y)
        out[prefix] = (x, y)
    return out


@pytest.mark.parametrize("gz", [True, False])
def test_idx_roundtrip_and_dataset(tmp_path, gz):
    data = _write_mnist(str(tmp_path), gz=gz)
    ext = ".gz" if gz else ""
    raw = open(tmp_path / f"train-images-idx3-ubyte{ext}", "rb").read(4)
    assert (raw[:2] == b"\x1f\x8b") == gz
    x = read_idx(str(tmp_path / f"train-images-idx3-ubyte{ext}"))
    np.testing.assert_array_equal(x, data["train"][0])
    for cls in (FashionMNIST, MNIST):
        tr, te = cls(str(tmp_path), train=True), cls(str(tmp_path), train=False)
        assert len(tr) == 7 and len(te) == 3 and tr.num_classes == 10
        assert tr.image_shape == (1, 28, 28) and tr.labels.dtype == np.int32
        np.testing.assert_array_equal(tr.get_images([2, 0])[..., 0], data["train"][0][[2, 0]])
        np.testing.assert_array_equal(te.labels, data["t10k"][1])
    # digits must not be mirrored; clothes may be (dataset defaults, used when hflip=None)
    assert not build_loader({}, MNIST(str(tmp_path)), 2, True, 0).hflip
    assert build_loader({"hflip": None}, FashionMNIST(str(tmp_path)), 2, True, 0).hflip


def test_idx_other_dtypes_roundtrip(tmp_path):
    for arr in (np.arange(6, dtype=np.int32).reshape(2, 3) - 3,
                np.linspace(0, 1, 4, dtype=np.float32)):
        p = str(tmp_path / "a.idx")
        write_idx(p, arr)
        out = read_idx(p)
        assert out.dtype == arr.dtype
        np.testing.assert_array_equal(out, arr)


def test_idx_missing_files(tmp_path):
    with pytest.raises(DataError) as e:
        FashionMNIST(str(tmp_path / "nowhere"))
    msg = str(e.value)
    assert "train-images-idx3-ubyte" in msg and str(tmp_path / "nowhere") in msg
    assert "apt-get install dataset-fashion-mnist" in msg and "data.root" in msg
    with pytest.raises(DataError, match="data.root"):
        MNIST(None)


def test_idx_corrupt_files(tmp_path):
    _write_mnist(str(tmp_path), gz=False)
    p = tmp_path / "train-images-idx3-ubyte"
    good = p.read_bytes()
    p.write_bytes(b"\x00\x01" + good[2:])  # bad magic
    with pytest.raises(DataError, match="magic") as e:
        MNIST(str(tmp_path))
    assert str(p) in str(e.value)
    p.write_bytes(good[:-5])  # truncated data
    with pytest.raises(DataError, match="truncated") as e:
        MNIST(str(tmp_path))
    assert str(p) in str(e.value)
    p.write_bytes(good)
    # labels file has the wrong count
    write_idx(str(tmp_path / "train-labels-idx1-ubyte"), np.zeros(5, np.uint8))
    with pytest.raises(DataError, match="7 images but .* 5 labels"):
        MNIST(str(tmp_path))
    # images and labels swapped -> dims check
    write_idx(str(tmp_path / "train-labels-idx1-ubyte"), np.zeros((7, 2, 2), np.uint8))
    with pytest.raises(DataError, match="swapped"):
        MNIST(str(tmp_path))
    # broken gzip stream
    q = tmp_path / "t10k-images-idx3-ubyte"
    q.write_bytes(gzip.compress(q.read_bytes())[:40])
    with pytest.raises(DataError) as e:
        MNIST(str(tmp_path), train=False)
    assert str(q) in str(e.value)


@pytest.mark.skipif(not os.path.isfile(os.path.join(FASHION_MNIST_DEFAULT_ROOT,
                                                    "t10k-images-idx3-ubyte.gz")),
                    reason="dataset-fashion-mnist not installed")
def test_real_fashion_mnist_test_split():
    ds = build_dataset({"name": "fashion_mnist"}, train=False)
    assert len(ds) == 10000 and ds.image_shape == (1, 28, 28)
    assert np.bincount(ds.labels).tolist() == [1000] * 10


# ---------------------------------------------------------------------------------- CIFAR
def _write_cifar10(d, per_batch=4):
    os.makedirs(d, exist_ok=True)
    r = _rng(2)
    from basebn.data.cifar import write_cifar_batch
    xs, ys = [], []
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        x = r.integers(0, 256, (per_batch, 32, 32, 3), dtype=np.uint8)
        y = r.integers(0, 10, per_batch)
        write_cifar_batch(os.path.join(d, name), x, y)
        xs.append(x)
        ys.append(y)
    return xs, ys


def test_cifar10(tmp_path):
    xs, ys = _write_cifar10(str(tmp_path / "cifar-10-batches-py"))
    for root in (tmp_path, tmp_path / "cifar-10-batches-py"):  # parent or batch dir
        tr = CIFAR10(str(root), train=True)
        te = CIFAR10(str(root), train=False)
        assert len(tr) == 20 and len(te) == 4 and tr.image_shape == (3, 32, 32)
        np.testing.assert_array_equal(tr.get_images(np.arange(20)), np.concatenate(xs[:5]))
        np.testing.assert_array_equal(tr.labels, np.concatenate(ys[:5]))
        np.testing.assert_array_equal(te.get_images([3]), xs[5][[3]])
    # CHW layout in the file: the first 1024 bytes of a row are the red plane
    d = pickle.load(open(tmp_path / "cifar-10-batches-py" / "test_batch", "rb"), encoding="bytes")
    np.testing.assert_array_equal(d[b"data"][0, :1024].reshape(32, 32), xs[5][0, :, :, 0])


def test_cifar100_and_errors(tmp_path):
    from basebn.data.cifar import write_cifar_batch
    d = tmp_path / "cifar-100-python"
    d.mkdir()
    r = _rng(3)
    x = r.integers(0, 256, (5, 32, 32, 3), dtype=np.uint8)
    write_cifar_batch(str(d / "train"), x, [0, 99, 5, 7, 50], label_key=b"fine_labels")
    ds = CIFAR100(str(tmp_path), train=True)
    assert ds.num_classes == 100 and ds.labels.tolist() == [0, 99, 5, 7, 50]
    np.testing.assert_array_equal(ds.get_images(np.arange(5)), x)
    with pytest.raises(DataError, match="test") as e:  # test split missing
        CIFAR100(str(tmp_path), train=False)
    assert str(tmp_path) in str(e.value)
    with pytest.raises(DataError, match="data_batch_1") as e:  # cifar10 is not there at all
        CIFAR10(str(tmp_path), train=True)
    assert "cifar-10-python.tar.gz" in str(e.value)
    (d / "test").write_bytes(b"\x80\x04garbage")
    with pytest.raises(DataError) as e:
        CIFAR100(str(tmp_path), train=False)
    assert str(d / "test") in str(e.value)
    with pytest.raises(DataError, match="data.root"):
        CIFAR10(None)


# ---------------------------------------------------------------------------- ImageFolder
def _write_folder(root, sizes=None):
    r = _rng(4)
    written = {}
    for split in ("train", "val"):
        for cls in ("zebra", "ant", "cat"):
            os.makedirs(os.path.join(root, split, cls))
            for i in range(2):
                h, w = (sizes or {}).get((split, cls, i), (8, 10))
                img = r.integers(0, 256, (h, w, 3), dtype=np.uint8)  # RGB
                p = os.path.join(root, split, cls, f"{i}.png")
                cv2.imwrite(p, cv2.cvtColor(img, cv2.COLOR_RGB2BGR))
                written[p] = img
        open(os.path.join(root, split, "ant", "notes.txt"), "w").write("not an image")
    return written


def test_image_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("BASEBN_DATA_CACHE", str(tmp_path / "cache"))
    written = _write_folder(str(tmp_path / "data"), sizes={("train", "cat", 1): (9, 12)})
    ds = ImageFolder(str(tmp_path / "data"), train=True, image_size=6)
    assert ds.classes == ["ant", "cat", "zebra"] and ds.num_classes == 3
    assert ds.labels.tolist() == [0, 0, 1, 1, 2, 2] and ds.image_shape == (3, 6, 6)
    for i, p in enumerate(ds.paths):  # load() decodes at the image's own size (no squashing)
        np.testing.assert_array_equal(ds.load(i), written[p])
    # get_images: shorter side resized to image_size (aspect kept), then the centre crop
    img = written[ds.paths[3]]  # 9 x 12 -> 6 x 8 -> columns 1..6
    ref = cv2.resize(img, (8, 6), interpolation=cv2.INTER_AREA)[:, 1:7]
    np.testing.assert_array_equal(ds.get_images([3])[0], ref)
    val = ImageFolder(str(tmp_path / "data"), train=False)
    assert val.split == "val" and len(val) == 6 and val.image_shape == (3, 224, 224)
    gray = ImageFolder(str(tmp_path / "data"), train=True, channels=1, image_size=4)
    assert gray.image_shape == (1, 4, 4)
    np.testing.assert_array_equal(gray.load(1)[:, :, 0], cv2.imread(ds.paths[1], cv2.IMREAD_GRAYSCALE))
    # the builder routes channels/image_size to the folder dataset
    b = build_dataset({"name": "imagefolder", "root": str(tmp_path / "data"), "channels": 1,
                       "image_size": 4}, train=False)
    assert b.image_shape == (1, 4, 4)


def test_image_folder_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("BASEBN_DATA_CACHE", str(tmp_path / "cache"))
    _write_folder(str(tmp_path))
    bad = os.path.join(str(tmp_path), "val", "zebra", "1.png")
    open(bad, "wb").write(b"\x89PNG not really")
    with pytest.raises(DataError) as e:  # val files are checked when the split is opened
        ImageFolder(str(tmp_path), train=False)
    assert bad in str(e.value)
    val = ImageFolder(str(tmp_path), train=False, check_files=False)
    with pytest.raises(DataError) as e:  # else when decoded
        val.get_images([5])
    assert bad in str(e.value)
    with pytest.raises(DataError, match="train"):
        ImageFolder(str(tmp_path / "empty"), train=True)


# ----------------------------------------------------------------------------- synthetic
def test_synthetic_deterministic_balanced():
    a = SyntheticShapes(train=True, image_size=16, size=500, seed=7)
    b = SyntheticShapes(train=True, image_size=16, size=500, seed=7)
    c = SyntheticShapes(train=False, image_size=16, size=500, seed=7)
    d = SyntheticShapes(train=True, image_size=16, size=500, seed=8)
    np.testing.assert_array_equal(a.images, b.images)
    np.testing.assert_array_equal(a.labels, b.labels)
    assert not np.array_equal(a.images, c.images) and not np.array_equal(a.images, d.images)
    assert a.image_shape == (1, 16, 16) and a.images.dtype == np.uint8 and a.num_classes == 10
    assert np.bincount(a.labels, minlength=10).min() >= 45
    # class means differ (the shapes are there), and the stats constants are in the right range
    means = np.stack([a.images[a.labels == k].mean(0) for k in range(10)])
    dist = np.abs(means[:, None] - means[None]).sum((2, 3, 4))
    assert dist[~np.eye(10, dtype=bool)].min() > 50
    assert abs(a.images.mean() - a.mean[0]) < 5 and abs(a.images.std() - a.std[0]) < 5


def test_synthetic_builder_sizes():
    cfg = {"name": "synthetic", "image_size": 12, "train_size": 40, "test_size": 20}
    tr, te = build_dataset(cfg, True), build_dataset(cfg, False)
    assert (len(tr), len(te), tr.image_shape) == (40, 20, (1, 12, 12))


# ----------------------------------------------------------------------------- transforms
def test_crop_flip_matches_direct_computation():
    x = _rng(5).integers(0, 256, (9, 6, 5, 2), dtype=np.uint8)
    pad = 2
    ys, xs, flips = sample_crop_flip(_rng(6), len(x), pad, hflip=True)
    assert ys.min() >= 0 and ys.max() <= 2 * pad and flips.any() and not flips.all()
    out = crop_flip(x, pad, ys, xs, flips)
    padded = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    for i in range(len(x)):
        ref = padded[i, ys[i]:ys[i] + 6, xs[i]:xs[i] + 5]
        np.testing.assert_array_equal(out[i], ref[:, ::-1] if flips[i] else ref)
    # random_crop / random_hflip consume the generator the same way
    c, ys2, xs2 = random_crop(x, pad, _rng(6))
    np.testing.assert_array_equal(ys2, ys)
    np.testing.assert_array_equal(xs2, xs)
    f, fl = random_hflip(x, _rng(9))
    for i in range(len(x)):
        np.testing.assert_array_equal(f[i], x[i, :, ::-1] if fl[i] else x[i])
    assert crop_flip(x, 0, np.zeros(9, int), np.zeros(9, int)) is x


def test_normalize():
    x = _rng(7).integers(0, 256, (3, 4, 5, 3), dtype=np.uint8)
    mean, std = (10.0, 20.0, 30.0), (2.0, 4.0, 8.0)
    out = normalize(x, mean, std)
    ref = (x.astype(np.float64).transpose(0, 3, 1, 2) - np.array(mean)[:, None, None]) \
        / np.array(std)[:, None, None]
    assert out.dtype == np.float32 and out.shape == (3, 3, 4, 5) and out.flags.c_contiguous
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-5)


# --------------------------------------------------------------------------------- loader
def _epoch(loader, epoch):
    loader.set_epoch(epoch)
    return [(x.copy(), y.copy()) for x, y in loader]


def _same(a, b):
    return len(a) == len(b) and all(np.array_equal(x1, x2) and np.array_equal(y1, y2)
                                    for (x1, y1), (x2, y2) in zip(a, b))


def test_loader_determinism_and_resume():
    ds = _tiny(n=30)
    mk = lambda **kw: BatchLoader(ds, 4, train=True, seed=3, pad=1, hflip=True, **kw)  # noqa
    a, b = mk(), mk(prefetch=False)
    assert len(a) == 7
    e0, e1, e2 = _epoch(a, 0), _epoch(a, 1), _epoch(a, 2)
    x, y = e0[0]
    assert x.shape == (4, 1, 6, 5) and x.dtype == np.float32 and y.dtype == np.int32
    assert _same(e0, _epoch(b, 0)) and _same(e2, _epoch(b, 2))
    assert not _same(e0, e1) and not _same(e1, e2)
    resumed = mk()  # a fresh loader starting at epoch 2 sees what the long run saw
    assert _same(_epoch(resumed, 2), e2)
    assert not _same(_epoch(mk(), 0), _epoch(BatchLoader(ds, 4, train=True, seed=4, pad=1), 0))
    with pytest.raises(RuntimeError, match="set_epoch"):
        iter(mk()).__next__()


def test_loader_augmentation_is_the_documented_one():
    ds = _tiny(n=12, c=2)
    ld = BatchLoader(ds, 5, train=True, seed=1, pad=2, prefetch=False)
    ld.set_epoch(3)
    batches = list(ld)
    for b, (x, y) in enumerate(batches):
        idx = ld.batch_indices(3)[b]
        ys, xs, fl = sample_crop_flip(ld.aug_rng(3, b), len(idx), 2, True)
        ref = crop_flip(ds.get_images(idx), 2, ys, xs, fl).transpose(0, 3, 1, 2)
        np.testing.assert_array_equal(x, ref.astype(np.float32))  # mean 0, std 1
        np.testing.assert_array_equal(y, ds.labels[idx])
    perm = np.random.default_rng([1, 3]).permutation(12)
    np.testing.assert_array_equal(np.concatenate(ld.batch_indices(3)), perm[:10])


def test_train_shards_disjoint():
    ds = _tiny(n=31)
    shards = [BatchLoader(ds, 3, train=True, seed=0, rank=r, world_size=3) for r in range(3)]
    assert {len(s) for s in shards} == {3}  # 31 // 3 = 10 per rank -> 3 full batches
    idx = [np.concatenate(s.batch_indices(5)) for s in shards]
    allidx = np.concatenate(idx)
    assert len(np.unique(allidx)) == len(allidx) == 27
    # ranks differ in augmentation streams too
    assert not np.array_equal(shards[0].aug_rng(5, 0).random(3), shards[1].aug_rng(5, 0).random(3))


def test_eval_sharding_covers_everything_once():
    ds = _tiny(n=23)
    seen = []
    for r in range(3):
        ld = BatchLoader(ds, 4, train=False, seed=0, rank=r, world_size=3)
        ys = [y for _, y in ld]
        assert len(ys) == len(ld) and len(ys[-1]) <= 4
        idx = np.concatenate(ld.batch_indices())
        np.testing.assert_array_equal(np.concatenate(ys), ds.labels[idx])
        seen.append(idx)
    seen = np.concatenate(seen)
    np.testing.assert_array_equal(np.sort(seen), np.arange(23))
    # eval batches are not augmented
    x, _ = next(iter(BatchLoader(ds, 23, train=False, seed=0)))
    np.testing.assert_array_equal(x, ds.images.transpose(0, 3, 1, 2).astype(np.float32))


def test_prefetch_early_stop_and_errors():
    ds = _tiny(n=40)
    ld = BatchLoader(ds, 2, train=True, seed=0)
    ld.set_epoch(0)
    it = iter(ld)
    next(it)
    next(it)
    del it  # consumer stops early: the producer thread must exit
    alive = [t for t in threading.enumerate() if t.name == "basebn-prefetch"]
    for t in alive:
        t.join(timeout=2)
    assert not any(t.is_alive() for t in alive)

    class Boom(ArrayDataset):
        def get_images(self, indices):
            raise DataError("cannot decode image /x.png")
    bad = Boom(ds.images, ds.labels, name="boom", num_classes=3, mean=(0,), std=(1,))
    ld = BatchLoader(bad, 2, train=False, seed=0)
    with pytest.raises(DataError, match="/x.png"):
        list(ld)


def test_loader_max_samples_and_small_dataset():
    ds = _tiny(n=50)
    ld = BatchLoader(ds, 4, train=False, seed=0, max_samples=10, prefetch=False)
    idx = ld.dataset.indices
    assert len(ld.dataset) == 10 and len(ld) == 3
    np.testing.assert_array_equal(
        BatchLoader(ds, 4, train=True, seed=9, max_samples=10).dataset.indices, idx)
    np.testing.assert_array_equal(np.concatenate([y for _, y in ld]), ds.labels[idx])
    with pytest.raises(DataError, match="too small"):
        BatchLoader(_tiny(n=5), 4, train=True, seed=0, world_size=2)


# ------------------------------------------------------------------------- build/validate
def test_build_dataset_and_loader_from_config():
    from basecore.config import ConfigDict
    cfg = ConfigDict(dict(name="synthetic", root=None, image_size=16, channels=3, pad=2,
                          hflip=False, mean=None, std=None, train_size=60, test_size=30,
                          max_train_samples=50, max_test_samples=None))
    tr = build_dataset(cfg, True)
    assert isinstance(tr.base, Adapted) and len(tr) == 50 and tr.image_shape == (3, 16, 16)
    assert len(tr.mean) == 3
    ld = build_loader(cfg, tr, 8, True, seed=0, rank=1, world_size=2)
    assert ld.pad == 2 and not ld.hflip and len(ld) == 3
    ld.set_epoch(0)
    x, y = next(iter(ld))
    assert x.shape == (8, 3, 16, 16) and np.array_equal(x[:, 0], x[:, 2])
    with pytest.raises(DataError) as e:
        build_dataset({"name": "imagenet22k"}, True)
    assert all(n in str(e.value) for n in DATASET_NAMES)


def test_adapted_resize_and_gray(tmp_path):
    _write_cifar10(str(tmp_path), per_batch=2)
    ds = build_dataset({"name": "cifar10", "root": str(tmp_path), "channels": 1,
                        "image_size": 16}, train=False)
    x = ds.get_images([0, 1])
    assert ds.image_shape == (1, 16, 16) and x.shape == (2, 16, 16, 1)
    ref = cv2.resize(cv2.cvtColor(CIFAR10(str(tmp_path), False).get_images([1])[0],
                                  cv2.COLOR_RGB2GRAY), (16, 16), interpolation=cv2.INTER_AREA)
    assert np.abs(x[1, :, :, 0].astype(int) - ref).max() <= 1
    # lazy path (a base that is not in memory) gives the same images as the precomputed one
    base = CIFAR10(str(tmp_path), False)
    sub = Subset(base, [1, 0])
    lazy = Adapted(sub, channels=3, image_size=16)
    eager = Adapted(base, channels=3, image_size=16)
    assert lazy._converted is None and eager._converted is not None
    np.testing.assert_array_equal(lazy.get_images([0, 1]), eager.get_images([1, 0]))
    rgb = Adapted(build_dataset({"name": "synthetic", "train_size": 10}, True), channels=3)
    g = rgb.get_images([3])
    assert g.shape == (1, 16, 16, 3) and (g == g[..., :1]).all() and len(rgb.mean) == 3


def test_validate_dataset_messages():
    ds = _tiny(n=12, classes=10, h=8, w=8)
    ds.name = "fashion_mnist"
    validate_dataset(ds, 10, in_channels=1, image_size=8)
    validate_dataset(ds, 12)  # extra outputs are allowed
    with pytest.raises(DataError, match="has 10 classes but num_classes=5; set num_classes=10"):
        validate_dataset(ds, 5)
    ds.num_classes = 3  # labels go beyond the declared classes
    with pytest.raises(DataError, match="labels up to 9 .*set num_classes=10"):
        validate_dataset(ds, 3)
    ds.num_classes = 10
    with pytest.raises(DataError, match="1-channel .* in_channels=3; set data.channels=3"):
        validate_dataset(ds, 10, in_channels=3)
    with pytest.raises(DataError, match="8x8 .* expects 32x32; set data.image_size=32"):
        validate_dataset(ds, 10, image_size=32)
    empty = ArrayDataset(np.zeros((0, 8, 8, 1), np.uint8), [], name="e", num_classes=10)
    with pytest.raises(DataError, match="empty"):
        validate_dataset(empty, 10)
    assert issubclass(DataError, ValueError)
