"""ImageFolder: formats and colour conversions against Pillow, aspect ratio kept end to end, the cached scan."""
import os

import cv2
import numpy as np
import pytest
from PIL import Image

from basebn.data import DataError, ImageFolder, build_dataset, build_loader
from basebn.data import folder_scan as folder_scan_module
from tests.support.image_folder import write_image_folder


@pytest.fixture(autouse=True)
def cache(data_cache, tmp_path, monkeypatch):
    """Every test here scans folders of its own (no file list remembered by this process either)."""
    monkeypatch.setattr(folder_scan_module, "_SCANNED", {})
    return tmp_path / "cache"


def save(img, path, mode=None):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.fromarray(img).convert(mode or Image.fromarray(img).mode).save(path, quality=95)
    return path


def test_formats_and_colour_modes_match_pillow(tmp_path):
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (30, 41, 3), dtype=np.uint8)
    smooth = cv2.GaussianBlur(rgb, (7, 7), 3)  # lossy formats keep it close
    d = str(tmp_path / "train" / "a")
    paths = [save(rgb, f"{d}/rgb.png"), save(rgb, f"{d}/rgb.bmp"), save(smooth, f"{d}/smooth.webp"),
             save(smooth, f"{d}/smooth.jpg"), save(rgb[..., 0], f"{d}/grey.png"),
             save(np.dstack([rgb, rng.integers(0, 256, (30, 41), dtype=np.uint8)]), f"{d}/rgba.png"),
             save(smooth, f"{d}/cmyk.jpg", "CMYK")]
    ds = ImageFolder(str(tmp_path), train=True, channels=3)
    grey = ImageFolder(str(tmp_path), train=True, channels=1)
    for p in paths:
        i = ds.paths.index(p)
        ref = np.asarray(Image.open(p).convert("RGB"))
        got = ds.load(i)
        assert got.shape == (30, 41, 3) and got.dtype == np.uint8  # own size, no squashing
        tol = 0 if p.endswith((".png", ".bmp")) else 3  # JPEG/WebP decoders may differ in rounding
        assert np.abs(got.astype(int) - ref).max() <= tol, p
        ref_l = np.asarray(Image.open(p).convert("RGB").convert("L")).astype(int)
        assert np.abs(grey.load(i)[..., 0].astype(int) - ref_l).max() <= tol + 1, p
    for lossy in (paths[2], paths[3]):  # lossy, but the image (not garbage)
        assert np.abs(ds.load(ds.paths.index(lossy)).astype(int) - smooth).mean() < 4


def test_eval_batches_keep_the_aspect_ratio(tmp_path):
    wide = np.random.default_rng(1).integers(0, 256, (40, 100, 3), dtype=np.uint8)
    save(wide, str(tmp_path / "val" / "a" / "wide.png"))
    save(wide[:, :40], str(tmp_path / "train" / "a" / "x.png"))
    cfg = dict(name="imagefolder", root=str(tmp_path), image_size=28, crop_pct=0.875, num_workers=0,
               mean=(0, 0, 0), std=(1, 1, 1))
    ds = build_dataset(cfg, train=False)
    (x, y), = list(build_loader(cfg, ds, 1, train=False))
    # resize the shorter side to 28 / 0.875 = 32 (40x100 -> 32x80), centre crop 28x28
    ref = cv2.resize(wide, (80, 32), interpolation=cv2.INTER_LINEAR)[2:30, 26:54]
    np.testing.assert_allclose(x[0].transpose(1, 2, 0), ref.astype(np.float32), atol=1.0)
    assert y.tolist() == [0]


def test_file_list_is_scanned_once_and_rescanned_when_a_folder_changes(tmp_path, cache, monkeypatch):
    root = str(tmp_path / "data")
    write_image_folder(root, per_class=2)
    first = ImageFolder(root, train=True)
    assert len(os.listdir(cache)) == 1  # one JSON per split directory
    walks = []
    real_walk = folder_scan_module._walk
    monkeypatch.setattr(folder_scan_module, "_walk", lambda d, *a: walks.append(d) or real_walk(d, *a))
    monkeypatch.setattr(folder_scan_module, "_SCANNED", {})  # a new process: only the disk cache
    again = ImageFolder(root, train=True)
    assert walks == [] and again.paths == first.paths and again.labels.tolist() == first.labels.tolist()
    new = os.path.join(root, "train", "dog", "new.png")
    cv2.imwrite(new, np.zeros((5, 5, 3), np.uint8))
    os.utime(os.path.dirname(new), ns=(1, 1))  # a changed directory mtime, whatever the clock resolution
    changed = ImageFolder(root, train=True)
    assert len(walks) == 3 and new in changed.paths and len(changed) == len(first) + 1
    assert changed.labels[changed.paths.index(new)] == changed.classes.index("dog")


def test_nested_folders_extensions_and_errors(tmp_path):
    root = tmp_path / "r"
    save(np.zeros((4, 4, 3), np.uint8), str(root / "train" / "b" / "deep" / "er" / "1.JPEG"))
    save(np.zeros((4, 4, 3), np.uint8), str(root / "train" / "a" / "2.Png"))
    (root / "train" / "a" / "notes.txt").write_text("not an image")
    (root / "train" / ".hidden").mkdir()
    ds = ImageFolder(str(root), train=True)
    assert ds.classes == ["a", "b"] and [os.path.basename(p) for p in ds.paths] == ["2.Png", "1.JPEG"]
    with pytest.raises(DataError, match="val"):
        ImageFolder(str(root), train=False)
    with pytest.raises(DataError, match="data.root"):
        ImageFolder(None)
    unreadable = root / "train" / "a" / "2.Png"
    unreadable.chmod(0)
    if not os.access(unreadable, os.R_OK):  # root reads anything
        with pytest.raises(DataError, match="cannot read image .*2.Png"):
            ds.load(0)
