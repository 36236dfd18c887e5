"""data.skip_bad_images: the warning is printed while training (a trainer takes exactly len(loader) batches) and
names the epoch as the training log does; evaluation leaves a bad image out instead of counting a duplicate; a bad
val image is found when the split is opened, before anything trains."""
import os

import cv2
import numpy as np
import pytest

from basebn.data import DataError, build_dataset, build_loader
from tests.support.image_folder import write_corrupt_png, write_image_folder
from tests.support.watchdog import watchdog


@pytest.fixture(autouse=True)
def cache(data_cache):
    """Every test here scans folders of its own."""


alarm = watchdog(60, lambda: RuntimeError("the loader hung"))




@pytest.mark.parametrize("workers", [0, 2])
def test_the_warning_is_printed_when_the_epoch_last_batch_is_taken(tmp_path, warnings, workers):
    root = str(tmp_path / "data")
    write_image_folder(root, per_class=7, splits=("train",))
    bad = os.path.join(root, "train", "dog", "3.png")
    open(bad, "wb").close()  # empty file
    cfg = dict(name="imagefolder", root=root, image_size=16, skip_bad_images=True, num_workers=workers)
    ds = build_dataset(cfg, train=True)
    loader = build_loader(cfg, ds, 5, train=True, seed=1)
    for epoch in (0, 1):
        assert ds.paths.index(bad) in np.concatenate(loader.batch_indices(epoch))  # not the sample drop_last drops
        loader.set_epoch(epoch)
        it = iter(loader)
        for _ in range(len(loader)):  # as ClsTrainer: exactly len(loader) next() calls, never the end
            next(it)
    loader.close()
    assert len(warnings) == 2, warnings
    for w, name in zip(warnings, ("epoch 1", "epoch 2")):  # 1-based, as "epoch 1/2 iter ..." in the log
        assert f"1 unreadable image(s) replaced by other samples 1 time(s) in {name} " in w and bad in w


@pytest.mark.parametrize("workers", [0, 2])
def test_evaluation_leaves_a_bad_image_out_and_counts_it(tmp_path, warnings, workers):
    root = str(tmp_path / "data")
    write_image_folder(root, per_class=5)
    bad = os.path.join(root, "val", "emu", "2.png")
    write_corrupt_png(bad)  # passes the check at opening (whole file), fails when decoded
    cfg = dict(name="imagefolder", root=root, image_size=16, skip_bad_images=True, num_workers=workers)
    ds = build_dataset(cfg, train=False)
    expected = [int(y) for p, y in zip(ds.paths, ds.labels) if p != bad]  # every other image once, in order
    loader = build_loader(cfg, ds, 4, train=False)
    loader.set_epoch(2)  # the evaluation after training epoch 3
    batches = list(loader)
    labels = np.concatenate([y for _, y in batches]).tolist()
    assert labels == expected and len(labels) == len(ds) - 1
    assert sum(len(x) for x, _ in batches) == len(ds) - 1
    assert len(warnings) == 1 and "1 unreadable image(s) left out of the evaluation after epoch 3" in warnings[0]
    assert bad in warnings[0]


def test_a_bad_val_image_is_found_when_the_split_is_opened(tmp_path, warnings):
    root = str(tmp_path / "data")
    write_image_folder(root, per_class=3)
    jpeg = cv2.imencode(".jpg", np.full((30, 40, 3), 99, np.uint8))[1].tobytes()
    cut = os.path.join(root, "val", "cat", "cut.jpg")
    with open(cut, "wb") as f:
        f.write(jpeg[:len(jpeg) // 2])  # truncated: cv2 alone would decode it
    cfg = dict(name="imagefolder", root=root, image_size=16)
    with pytest.raises(DataError, match=r"bad image .*cut.jpg: truncated JPEG.*skip_bad_images"):
        build_dataset(cfg, train=False)
    ds = build_dataset(dict(cfg, skip_bad_images=True), train=False)
    assert cut not in ds.paths and len(ds) == 9
    assert any("1 bad image(s)" in w and cut in w for w in warnings)
