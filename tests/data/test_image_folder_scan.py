"""What an image-folder scan and decode must not get wrong: symlink loops and self-links (no hang, nothing counted
twice, said), unreadable class directories (an error naming them, or counted), the channel count (a grey image first
does not make an RGB dataset grey), and truncated JPEGs (a bad image, not trained on)."""
import os

import cv2
import numpy as np
import pytest

from basebn.data import DataError, ImageFolder, build_dataset, build_loader
from tests.support.watchdog import watchdog


@pytest.fixture(autouse=True)
def cache(data_cache):
    """Every test here scans folders of its own."""


class Hung(Exception):
    """Not an OSError (as TimeoutError is): os.walk swallows those and walks on."""


alarm = watchdog(30, lambda: Hung("the image-folder scan hung"))




def rgb_folder(root, classes=("cat", "dog"), per_class=4, split="train", seed=0):
    rng = np.random.default_rng(seed)
    for c in classes:
        os.makedirs(os.path.join(root, split, c), exist_ok=True)
        for i in range(per_class):
            cv2.imwrite(os.path.join(root, split, c, f"{i}.png"), rng.integers(0, 256, (9, 11, 3), dtype=np.uint8))


def jpeg_bytes(seed=0, size=(48, 64)):
    img = cv2.GaussianBlur(np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8), (5, 5), 2)
    ok, buf = cv2.imencode(".jpg", img)
    assert ok
    return buf.tobytes()


# --------------------------------------------------------------------------------------------- symlinks
def test_a_symlink_loop_ends_and_is_reported(tmp_path, logs):
    rgb_folder(tmp_path, per_class=8)
    os.symlink("..", tmp_path / "train" / "cat" / "up1")  # the case: an exponential walk
    os.symlink("..", tmp_path / "train" / "cat" / "up2")
    ds = ImageFolder(str(tmp_path), train=True)
    assert len(ds) == 16 and ds.classes == ["cat", "dog"]
    assert sorted(ds.labels.tolist()) == [0] * 8 + [1] * 8
    assert len(set(map(os.path.realpath, ds.paths))) == 16  # no file twice
    assert any("not followed" in m and "up1" in m and "up2" in m for m in logs)


def test_a_self_link_does_not_copy_a_class(tmp_path, logs):
    rgb_folder(tmp_path, per_class=8)
    os.symlink(".", tmp_path / "train" / "cat" / "self")  # 8 images became 328
    os.symlink("../dog", tmp_path / "train" / "cat" / "dogs")  # another class's folder is not cat's
    ds = ImageFolder(str(tmp_path), train=True)
    assert len(ds) == 16 and np.bincount(ds.labels).tolist() == [8, 8]
    assert all(os.path.dirname(p).endswith("dog") for p, y in zip(ds.paths, ds.labels) if y == 1)
    assert any("self" in m and "dogs" in m and "not followed" in m for m in logs)


def test_linked_directories_are_still_followed_once(tmp_path):
    rgb_folder(tmp_path, per_class=2)
    extra = tmp_path / "elsewhere"
    rgb_folder(extra, classes=("more",), per_class=3, split="x", seed=1)
    os.symlink(extra / "x" / "more", tmp_path / "train" / "cat" / "more")
    ds = ImageFolder(str(tmp_path), train=True)
    assert np.bincount(ds.labels).tolist() == [5, 2]


# --------------------------------------------------------------------------------------- unreadable dirs
def deny(monkeypatch, denied):
    """os.scandir raises PermissionError for `denied` (chmod does not stop root, who runs some CIs)."""
    real = os.scandir

    def scandir(path="."):
        if os.path.abspath(path) == os.path.abspath(denied):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)
    monkeypatch.setattr(os, "scandir", scandir)


def test_an_unreadable_class_directory_is_an_error_naming_it(tmp_path, monkeypatch):
    rgb_folder(tmp_path, classes=("cat", "dog", "emu"))
    deny(monkeypatch, tmp_path / "train" / "dog")
    with pytest.raises(DataError, match=r"cannot read directory .*train/dog: Permission denied.*skip_bad_images"):
        build_dataset(dict(name="imagefolder", root=str(tmp_path)), train=True)


def test_with_skip_bad_images_an_unreadable_directory_is_counted(tmp_path, monkeypatch, logs):
    rgb_folder(tmp_path, classes=("cat", "dog", "emu"))
    deny(monkeypatch, tmp_path / "train" / "dog")
    ds = build_dataset(dict(name="imagefolder", root=str(tmp_path), skip_bad_images=True), train=True)
    assert ds.classes == ["cat", "dog", "emu"] and np.bincount(ds.labels, minlength=3).tolist() == [4, 0, 4]
    assert any("1 unreadable directory(ies)" in m and "train/dog" in m for m in logs)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any directory")
def test_a_directory_without_read_permission(tmp_path):
    rgb_folder(tmp_path)
    (tmp_path / "train" / "dog").chmod(0)
    try:
        with pytest.raises(DataError, match="cannot read directory .*train/dog"):
            ImageFolder(str(tmp_path), train=True)
    finally:
        (tmp_path / "train" / "dog").chmod(0o755)


# -------------------------------------------------------------------------------------------- channels
def test_a_grey_image_sorting_first_does_not_make_an_rgb_dataset_grey(tmp_path, logs):
    rgb_folder(tmp_path, classes=("b", "c"))
    rgb_folder(tmp_path, classes=("b", "c"), split="val")
    grey = np.random.default_rng(3).integers(0, 256, (9, 11), dtype=np.uint8)
    os.makedirs(tmp_path / "train" / "a")
    os.makedirs(tmp_path / "val" / "a")
    cv2.imwrite(str(tmp_path / "train" / "a" / "0.png"), grey)  # the first file of the first class
    cv2.imwrite(str(tmp_path / "val" / "a" / "0.png"), grey)
    for train in (True, False):
        ds = ImageFolder(str(tmp_path), train=train)
        assert ds.paths[0].endswith(os.path.join("a", "0.png"))
        assert ds.channels == 3 and ds.image_shape[0] == 3
        np.testing.assert_array_equal(ds.load(0), np.repeat(grey[..., None], 3, axis=2))  # converted
    assert any("3 input channels" in m for m in logs)


def test_a_grey_dataset_is_one_channel_and_val_follows_training(tmp_path, logs):
    rng = np.random.default_rng(4)
    for split, cls in (("train", "a"), ("train", "b"), ("val", "a")):
        os.makedirs(tmp_path / split / cls)
        cv2.imwrite(str(tmp_path / split / cls / "0.png"), rng.integers(0, 256, (5, 6), dtype=np.uint8))
    colour = rng.integers(0, 256, (5, 6, 3), dtype=np.uint8)
    cv2.imwrite(str(tmp_path / "val" / "a" / "1.png"), colour)  # val's colour images do not decide
    train, val = ImageFolder(str(tmp_path), train=True), ImageFolder(str(tmp_path), train=False)
    assert train.channels == val.channels == 1
    b, g, r = (colour[..., k].astype(float) for k in range(3))  # written as BGR
    luma = 0.299 * r + 0.587 * g + 0.114 * b  # ITU-R BT.601; decoders round differently
    np.testing.assert_allclose(val.load(1)[..., 0], luma, atol=1.0)
    assert any("1 input channel" in m for m in logs)


# ------------------------------------------------------------------------------------------- truncation
def test_a_truncated_jpeg_is_a_bad_image(tmp_path):
    rgb_folder(tmp_path)
    whole = jpeg_bytes()
    truncated = tmp_path / "train" / "dog" / "cut.jpg"
    truncated.write_bytes(whole[: len(whole) * 2 // 3])
    assert cv2.imdecode(np.frombuffer(truncated.read_bytes(), np.uint8), cv2.IMREAD_COLOR) is not None  # cv2 alone
    (tmp_path / "train" / "dog" / "whole.jpg").write_bytes(whole + b"\0\0")  # padding after the end marker is fine
    cfg = dict(name="imagefolder", root=str(tmp_path), image_size=8, num_workers=0)
    ds = build_dataset(cfg, train=True)
    ds.load(ds.paths.index(str(tmp_path / "train" / "dog" / "whole.jpg")))
    with pytest.raises(DataError, match=r"cut.jpg: truncated JPEG"):
        ds.load(ds.paths.index(str(truncated)))
    loader = build_loader(cfg, ds, len(ds), train=True)  # one batch: every image
    loader.set_epoch(0)
    with pytest.raises(DataError, match=r"cut.jpg: truncated JPEG.*skip_bad_images"):
        list(loader)
