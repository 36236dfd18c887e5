"""Tiny ImageFolder trees (random images of different sizes and formats) for the data tests, and a config."""
import os

import cv2
import numpy as np

FORMATS = (".jpg", ".png", ".webp", ".bmp")


def write_image_folder(root, classes=("cat", "dog", "emu"), per_class=6, splits=("train", "val"), seed=0,
                       size_range=(20, 48)):
    """Write root/SPLIT/CLASS/i.EXT (formats cycling, random sizes); returns {path: RGB uint8 as decoded}."""
    rng = np.random.default_rng(seed)
    written = {}
    for split in splits:
        for cls in classes:
            os.makedirs(os.path.join(root, split, cls), exist_ok=True)
            for i in range(per_class):
                h, w = (int(v) for v in rng.integers(*size_range, 2))
                rgb = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
                path = os.path.join(root, split, cls, f"{i}{FORMATS[i % len(FORMATS)]}")
                cv2.imwrite(path, cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
                written[path] = cv2.cvtColor(cv2.imread(path, cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
    return written


FOLDER_CONFIG = """
from basebn.config import BaseConfig
class Cfg(BaseConfig):
    def __init__(self):
        super().__init__()
        self.merge(dict(batch_size=6, seed=5, num_classes=3,
            data=dict(name="imagefolder", root={root!r}, image_size=16, num_workers=2),
            model=dict(name="resnet20", base_width=4), solver=dict(max_epoch=2, warmup_epochs=1),
            log_every_n_iter=1))
"""


def folder_config(tmp_path, **write_kw):
    """(config path, data root) of a tiny image-folder experiment (2 workers, 16 px crops)."""
    root = os.path.join(str(tmp_path), "folder")
    write_image_folder(root, **write_kw)
    path = os.path.join(str(tmp_path), "folder_cfg.py")
    with open(path, "w") as f:
        f.write(FOLDER_CONFIG.format(root=root))
    return path, root


def write_corrupt_png(path, seed=0):
    """A PNG whose header and IEND end are intact but whose image data is damaged: only decoding finds it."""
    img = np.random.default_rng(seed).integers(0, 256, (40, 50, 3), dtype=np.uint8)
    data = bytearray(cv2.imencode(".png", img)[1].tobytes())
    start = data.find(b"IDAT") + 40
    data[start:start + 40] = bytes(b ^ 0x5A for b in data[start:start + 40])
    with open(path, "wb") as f:
        f.write(bytes(data))
