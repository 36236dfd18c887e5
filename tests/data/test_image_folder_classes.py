"""Image folders whose splits have different class sets: one class list (the training folders, or data.classes),
val labels by name, a val class unknown to training refused in one line, num_classes checked, empty classes reported."""
import os

import cv2
import numpy as np
import pytest

from basebn.config import ConfigError, load_config
from basebn.data import DataError, build_dataset, validate_dataset


@pytest.fixture(autouse=True)
def cache(data_cache):
    """Every test here scans folders of its own."""




def write(root, split, classes, per_class=2):
    """root/split/CLASS/i.png, each a solid colour unique to (split, class, i)."""
    for c in classes:
        os.makedirs(os.path.join(root, split, c), exist_ok=True)
        for i in range(per_class):
            cv2.imwrite(os.path.join(root, split, c, f"{i}.png"), np.full((6, 7, 3), 10 * i + len(c), np.uint8))


def folder(root, **kw):
    return build_dataset(dict(name="imagefolder", root=str(root), image_size=8, **kw), train=False)


def labels_by_class(ds):
    """{class folder name: set of labels} read from the dataset's own path list."""
    out = {}
    for path, label in zip(ds.paths, ds.labels.tolist()):
        out.setdefault(os.path.basename(os.path.dirname(path)), set()).add(label)
    return out


def test_val_classes_take_the_training_labels_by_name(tmp_path):
    write(tmp_path, "train", ["cat", "dog", "emu"])
    write(tmp_path, "val", ["dog", "emu"])  # a val split without one of the training classes
    train = build_dataset(dict(name="imagefolder", root=str(tmp_path), image_size=8), train=True)
    val = folder(tmp_path)
    reference = {name: i for i, name in enumerate(sorted(["cat", "dog", "emu"]))}  # sorted training folders
    assert labels_by_class(val) == {"dog": {reference["dog"]}, "emu": {reference["emu"]}}
    assert labels_by_class(train) == {c: {i} for c, i in reference.items()}
    assert val.classes == train.classes and val.num_classes == 3
    validate_dataset(val, 3)


def test_a_val_class_missing_from_training_is_refused_naming_it(tmp_path):
    write(tmp_path, "train", ["cat", "dog"])
    write(tmp_path, "val", ["ant", "cat", "dog"])  # the case: val's cat got train's dog label
    with pytest.raises(DataError, match=r"val/ant is not among the training classes.*cat, dog"):
        folder(tmp_path)


def test_data_classes_fix_the_label_order_for_both_splits(tmp_path):
    write(tmp_path, "train", ["cat", "dog"])
    write(tmp_path, "val", ["dog"])
    order = ["dog", "cat", "yak"]
    train = build_dataset(dict(name="imagefolder", root=str(tmp_path), image_size=8, classes=order), train=True)
    val = folder(tmp_path, classes=order)
    assert labels_by_class(train) == {"dog": {0}, "cat": {1}} and labels_by_class(val) == {"dog": {0}}
    assert train.num_classes == val.num_classes == 3
    with pytest.raises(DataError, match=r"train/dog is not among data.classes"):
        build_dataset(dict(name="imagefolder", root=str(tmp_path), classes=["cat"]), train=True)
    with pytest.raises(DataError, match="data.classes must be a list of distinct"):
        build_dataset(dict(name="imagefolder", root=str(tmp_path), classes=["cat", "cat"]), train=True)


def test_num_classes_other_than_the_folder_class_count_is_refused(tmp_path):
    write(tmp_path, "train", ["cat", "dog", "emu"])
    write(tmp_path, "val", ["cat"])
    for train in (True, False):
        ds = build_dataset(dict(name="imagefolder", root=str(tmp_path), image_size=8), train=train)
        validate_dataset(ds, 3)
        for wrong in (2, 5):
            with pytest.raises(DataError, match=r"has 3 classes but num_classes=%d; set num_classes=3" % wrong):
                validate_dataset(ds, wrong)


def test_empty_class_folders_are_reported(tmp_path, warnings):
    write(tmp_path, "train", ["cat", "dog"])
    os.makedirs(tmp_path / "train" / "emu")  # an empty class folder keeps its label
    write(tmp_path, "val", ["cat", "dog"])
    os.makedirs(tmp_path / "val" / "dog" / "empty_subfolder")
    os.makedirs(tmp_path / "val" / "emu")
    train = build_dataset(dict(name="imagefolder", root=str(tmp_path), image_size=8), train=True)
    assert train.classes == ["cat", "dog", "emu"] and 2 not in set(train.labels.tolist())
    assert any("1 class(es) with no images" in w and "emu" in w and str(tmp_path / "train") in w for w in warnings)
    warnings.clear()
    folder(tmp_path)
    assert any("no images" in w and "emu" in w and str(tmp_path / "val") in w for w in warnings)


def test_the_data_classes_config_key_is_checked_at_load(tiny):
    assert load_config(tiny, ['data.classes=["b","a"]']).data.classes == ["b", "a"]
    for bad in ('["a","a"]', '[""]', "[]", "3"):
        with pytest.raises(ConfigError, match="data.classes"):
            load_config(tiny, [f"data.classes={bad}"])
