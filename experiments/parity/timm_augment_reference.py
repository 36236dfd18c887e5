"""The timm side of experiments/parity/augment_vs_timm.py; runs in a Python that has timm (and torch), not basebn.

Usage: PYTHON_WITH_TIMM experiments/parity/timm_augment_reference.py IMAGE.npy OUT.npz
Writes timm's argument and output for every AutoAugment/RandAugment op at a few magnitudes and both
signs, and timm's images per CPU-second for its train transform (RandomResizedCrop, flip, rand-m9-mstd0.5,
ToTensor, Normalize) on the same 500x375 image.
"""
import random
import sys
import time

import numpy as np
import timm.data.auto_augment as aa
import torch
from PIL import Image
from timm.data import create_transform

MAGNITUDES = (0, 3, 9, 10)


def op_outputs(img: np.ndarray):
    """{key: array} with timm's args and outputs per (op, magnitude, negate)."""
    crop = Image.fromarray(img[:224, :224])
    hparams = dict(translate_const=int(224 * 0.45), img_mean=(124, 116, 104),
                   interpolation=Image.Resampling.BILINEAR)
    out = {}
    stdlib_random = random.random
    for name in sorted(aa.NAME_TO_OP):
        if name not in aa.LEVEL_TO_ARG or name.startswith(("Gaussian", "Desaturate")):
            continue
        for m in MAGNITUDES:
            for negate in (False, True):
                random.random = (lambda: 0.9) if negate else (lambda: 0.1)  # timm negates when > 0.5
                try:
                    level_fn = aa.LEVEL_TO_ARG[name]
                    args = level_fn(m, hparams) if level_fn is not None else ()
                finally:
                    random.random = stdlib_random
                kwargs = dict(fillcolor=hparams["img_mean"], resample=hparams["interpolation"])
                res = aa.NAME_TO_OP[name](crop, *args, **kwargs)
                key = f"{name}|{m}|{int(negate)}"
                out["args|" + key] = np.asarray(args, np.float64)
                out["img|" + key] = np.asarray(res)
    return out


def train_speed(img: np.ndarray, n: int = 300) -> float:
    """timm's train transform images per CPU-second on one thread."""
    torch.set_num_threads(1)
    t = create_transform(224, is_training=True, auto_augment="rand-m9-mstd0.5", interpolation="bilinear",
                         re_prob=0.0)
    pil = Image.fromarray(img)
    for _ in range(20):
        t(pil)
    t0 = time.process_time()
    for _ in range(n):
        t(pil)
    return n / (time.process_time() - t0)


if __name__ == "__main__":
    image = np.load(sys.argv[1])
    results = op_outputs(image)
    results["speed"] = np.array(train_speed(image))
    np.savez(sys.argv[2], **results)
