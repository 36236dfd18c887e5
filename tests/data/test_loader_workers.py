"""BatchLoader with worker processes: identical batches for 0, 1 and 4 workers (and equal to the documented
per-sample recipe), errors and dead workers reported, workers released."""
import os
import signal
import time

import cv2
import numpy as np
import pytest
from loguru import logger

from basebn.data import DataError, SyntheticShapes, build_dataset, build_loader
from basebn.data.augment import build_sample_transform
from basebn.data.image_folder import decode_image
from tests.support.image_folder import write_image_folder
from tests.support.watchdog import watchdog

AUG_TAG, MIX_TAG = 0xA06, 0x313  # the documented stream tags (basebn/data/loader.py)


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv("BASEBN_DATA_CACHE", str(tmp_path / "cache"))
    root = str(tmp_path / "data")
    write_image_folder(root, per_class=7)
    return root


alarm = watchdog(60, lambda: TimeoutError("the loader hung"))


def epochs(loader, which=(0, 1)):
    out = []
    for e in which:
        loader.set_epoch(e)
        out += [(x.copy(), y.copy()) for x, y in loader]
    return out


def assert_same(a, b):
    assert len(a) == len(b)
    for (x1, y1), (x2, y2) in zip(a, b):
        assert x1.dtype == x2.dtype and y1.dtype == y2.dtype
        np.testing.assert_array_equal(x1, x2)
        np.testing.assert_array_equal(y1, y2)


FOLDER_AUG = dict(color_jitter=(0.4, 0.4, 0.4), auto_augment="rand-m9-mstd0.5", mixup=0.8, cutmix=1.0,
                  random_erasing=dict(prob=0.5, area=(0.02, 1 / 3), aspect=0.3, mode="pixel", count=1))


def test_folder_batches_identical_for_0_1_4_workers_and_follow_the_recipe(folder):
    cfg = dict(name="imagefolder", root=folder, image_size=16, **FOLDER_AUG)
    ds = build_dataset(cfg, train=True)
    runs = {}
    for workers in (0, 1, 4):
        loader = build_loader(dict(cfg, num_workers=workers, prefetch=1), ds, 5, train=True, seed=7)
        runs[workers] = epochs(loader)
        assert len(runs[workers]) == 2 * (21 // 5)
        loader.close()
    assert_same(runs[0], runs[1])
    assert_same(runs[0], runs[4])
    x, y = runs[0][0]
    assert x.shape == (5, 3, 16, 16) and y.shape == (5, 3) and y.dtype == np.float32  # soft targets

    # without the mixer, each sample is the transform of the decoded file with the documented generator
    plain = dict(cfg, mixup=0.0, cutmix=0.0)
    loader = build_loader(dict(plain, num_workers=2), ds, 5, train=True, seed=7)
    loader.set_epoch(1)
    got = list(loader)
    loader.close()
    transform = build_sample_transform(dict(plain, train_crop="random_resized"), True, ds.mean, ds.std, 16)
    perm = np.random.default_rng([7, 1]).permutation(len(ds))
    for b, (x, y) in enumerate(got):
        for i in range(5):
            index = perm[b * 5 + i]
            ref = transform(decode_image(ds.paths[index], 3), np.random.default_rng([AUG_TAG, 7, 1, 0, b, i]))
            np.testing.assert_array_equal(x[i], ref)
            assert y[i] == ds.labels[index]


def test_in_memory_batches_identical_with_workers_and_eval_unchanged():
    ds = SyntheticShapes(train=True, image_size=12, size=64, seed=1)
    cfg = dict(name="synthetic", pad=2, mixup=0.2,
               random_erasing=dict(prob=0.5, area=(0.02, 1 / 3), aspect=0.3, mode="const", count=1))
    a = build_loader(dict(cfg, num_workers=0), ds, 8, train=True, seed=3)
    b = build_loader(dict(cfg, num_workers=3), ds, 8, train=True, seed=3)
    assert_same(epochs(a), epochs(b))
    b.close()
    ev = build_loader(dict(cfg, num_workers=2), ds, 10, train=False)
    xs = np.concatenate([x for x, _ in ev])
    ref = (ds.images.transpose(0, 3, 1, 2).astype(np.float32) - np.float32(ds.mean[0])) / np.float32(ds.std[0])
    np.testing.assert_allclose(xs, ref, rtol=1e-6)
    assert ev.worker_pids == []  # eval loaders free their workers after each pass


def test_resume_mid_run_and_early_stop_with_workers(folder):
    cfg = dict(name="imagefolder", root=folder, image_size=16, num_workers=2, prefetch=2)
    ds = build_dataset(cfg, train=True)
    loader = build_loader(cfg, ds, 4, train=True, seed=1)
    full = epochs(loader, (0, 1, 2))
    loader.set_epoch(1)
    it = iter(loader)
    next(it)
    del it  # the consumer stops early; the next epoch must not see stale slots
    assert_same(epochs(loader, (2,)), full[10:])
    loader.close()
    fresh = build_loader(cfg, ds, 4, train=True, seed=1)  # a resumed run starts at epoch 2
    assert_same(epochs(fresh, (2,)), full[10:])
    fresh.close()


def test_unreadable_image_names_its_path_with_workers(folder):
    bad = os.path.join(folder, "train", "dog", "2.webp")
    with open(bad, "wb") as f:
        f.write(b"RIFF....WEBPnot an image")
    cfg = dict(name="imagefolder", root=folder, image_size=16, num_workers=2)
    ds = build_dataset(cfg, train=True)
    loader = build_loader(cfg, ds, 7, train=True, seed=0)
    loader.set_epoch(0)
    with pytest.raises(DataError, match="skip_bad_images") as e:
        list(loader)
    assert bad in str(e.value)
    loader.close()


def test_skip_bad_images_replaces_deterministically_and_warns_once_per_epoch(folder):
    bad = [os.path.join(folder, "train", "cat", "1.png"), os.path.join(folder, "train", "emu", "4.jpg")]
    for p in bad:
        open(p, "wb").close()  # empty file
    cfg = dict(name="imagefolder", root=folder, image_size=16, skip_bad_images=True)
    ds = build_dataset(cfg, train=True)
    warnings = []
    sink = logger.add(lambda m: warnings.append(str(m)), level="WARNING", format="{message}")
    try:
        runs = []
        for workers in (0, 2):
            loader = build_loader(dict(cfg, num_workers=workers), ds, 7, train=True, seed=2)
            runs.append(epochs(loader, (0,)))
            loader.close()
    finally:
        logger.remove(sink)
    assert_same(*runs)
    assert len(warnings) == 2 and all("2 unreadable image(s) replaced" in w for w in warnings)
    assert any(p in warnings[0] for p in bad)
    x = np.concatenate([x for x, _ in runs[0]])
    assert np.isfinite(x).all() and len(x) == 21


def test_a_killed_worker_ends_the_iteration_with_a_clear_error(folder):
    cfg = dict(name="imagefolder", root=folder, image_size=16, num_workers=2, prefetch=1)
    ds = build_dataset(cfg, train=True)
    loader = build_loader(cfg, ds, 1, train=True, seed=0)
    loader.set_epoch(0)
    it = iter(loader)
    next(it)
    victim = loader.worker_pids[1]
    os.kill(victim, signal.SIGKILL)
    with pytest.raises(DataError, match=rf"worker 1 \(pid {victim}\) was killed by SIGKILL.*data.num_workers"):
        for _ in it:
            pass
    assert loader.worker_pids == []  # the pool is shut down, the other worker too


def test_dropping_the_loader_stops_its_workers(folder):
    cfg = dict(name="imagefolder", root=folder, image_size=16, num_workers=2)
    loader = build_loader(cfg, build_dataset(cfg, train=True), 4, train=True, seed=0)
    loader.set_epoch(0)
    next(iter(loader))
    pids = loader.worker_pids
    assert len(pids) == 2 and all(os.path.exists(f"/proc/{p}") for p in pids)
    del loader
    for p in pids:
        assert not os.path.exists(f"/proc/{p}") or open(f"/proc/{p}/stat").read().split()[2] == "Z"


def test_workers_forked_after_cv2_used_its_thread_pool(folder):
    """cv2's thread pool has no threads in a forked child: a worker resizing it (cv2.setNumThreads) hung."""
    big = np.random.default_rng(0).integers(0, 256, (1500, 1500, 3), dtype=np.uint8)
    for _ in range(3):
        cv2.resize(big, (900, 700), interpolation=cv2.INTER_LINEAR)  # parallel in the parent
    threads = cv2.getNumThreads()
    cfg = dict(name="imagefolder", root=folder, image_size=64, num_workers=2)
    loader = build_loader(cfg, build_dataset(cfg, train=True), 4, train=True, seed=0)
    loader.set_epoch(0)
    assert len(list(loader)) == 5  # completes (the alarm fixture fails a hang)
    assert cv2.getNumThreads() == threads  # the parent keeps its own setting
    loader.close()


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSEGV])
def test_a_worker_that_died_before_its_next_task_is_reported_in_one_line(folder, sig):
    """Handing a task to a dead worker raised BrokenPipeError (a 30-line traceback through the CLI)."""
    cfg = dict(name="imagefolder", root=folder, image_size=16, num_workers=2, prefetch=1)
    loader = build_loader(cfg, build_dataset(cfg, train=True), 1, train=True, seed=0)
    loader.set_epoch(0)
    it = iter(loader)
    next(it)  # batch 0 came from worker 0, whose next task (batch 2) is sent when batch 1 is asked for
    victim = loader.worker_pids[0]
    os.kill(victim, sig)
    while open(f"/proc/{victim}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":  # dead: its pipe end closed
        time.sleep(0.01)
    with pytest.raises(DataError, match=rf"worker 0 \(pid {victim}\) was killed by {sig.name}.*num_workers"):
        for _ in it:
            pass
    assert loader.worker_pids == []
