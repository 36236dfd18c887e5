"""experiments/fashion_mnist_c.py writes folders that basebn's Fashion-MNIST loader reads back exactly.

The corruptions themselves come from the imagecorruptions package (benchmark venv only); here the script's IDX writer
and folder layout are checked against basebn's own IDX reader/writer and dataset class (peer implementations).
"""
import os

import numpy as np

from basebn.data.idx import FashionMNIST, read_idx, write_idx
from experiments import fashion_mnist_c as fmc


def _fake_source(root, rng):
    os.makedirs(root)
    split = {}
    for prefix, n in (("train", 7), ("t10k", 5)):
        images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, n, dtype=np.uint8)
        write_idx(os.path.join(root, f"{prefix}-images-idx3-ubyte.gz"), images)
        write_idx(os.path.join(root, f"{prefix}-labels-idx1-ubyte.gz"), labels)
        split[prefix] = (images, labels)
    return split


def test_written_folder_loads_as_fashion_mnist(tmp_path):
    rng = np.random.default_rng(0)
    src = str(tmp_path / "src")
    split = _fake_source(src, rng)
    corrupted = (255 - split["t10k"][0]).astype(np.uint8)
    folder = str(tmp_path / "out" / "contrast" / "5")
    fmc.write_folder(folder, corrupted, fmc.find_file(src, fmc.TEST_LABELS), src)

    np.testing.assert_array_equal(read_idx(os.path.join(folder, "t10k-images-idx3-ubyte.gz")), corrupted)
    test = FashionMNIST(folder, train=False)
    np.testing.assert_array_equal(np.asarray(test.images)[..., 0], corrupted)
    np.testing.assert_array_equal(np.asarray(test.labels), split["t10k"][1])
    train = FashionMNIST(folder, train=True)  # linked from the source, as the recalibration tool needs
    np.testing.assert_array_equal(np.asarray(train.images)[..., 0], split["train"][0])


def test_script_reader_matches_basebn_writer(tmp_path):
    arr = np.random.default_rng(1).integers(0, 256, (3, 28, 28), dtype=np.uint8)
    path = str(tmp_path / "x-idx3-ubyte")
    write_idx(path, arr)
    np.testing.assert_array_equal(fmc.read_idx(path), arr)


def test_excluded_corruptions_are_named_with_a_reason():
    assert "frost" in fmc.EXCLUDED and "frost" not in fmc.APPLICABLE
    assert len(fmc.APPLICABLE) + sum(c in fmc.EXCLUDED for c in fmc.COMMON) == 15
