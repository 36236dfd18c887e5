"""Images/s of the training loader for 0, 1, 2 ... data workers, measured side by side (interleaved rounds,
median) with basebn.tools.data_speed's measure(): python benchmarks/data_workers.py CONFIG [KEY=VALUE ...]
[--workers 0,1,2] [--batches 20] [--rounds 3]. Without CONFIG it writes ~500 JPEGs of 500x375 to a temporary
ImageFolder and measures RandomResizedCrop 224 + flip, then the same with RandAugment (rand-m9-mstd0.5).
"""
import argparse
import os
import statistics
import sys
import tempfile

import cv2
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from basebn.config import load_config  # noqa: E402
from basebn.engine.build import build_data  # noqa: E402
from basebn.tools.data_speed import measure  # noqa: E402

FOLDER_CFG = """
from basebn.config import BaseConfig
class Cfg(BaseConfig):
    def __init__(self):
        super().__init__()
        self.merge(dict(batch_size=32, num_classes=10,
            data=dict(name="imagefolder", root={root!r}, image_size=224, train_crop="random_resized", hflip=True),
            model=dict(name="resnet50", stem="imagenet")))
"""


def write_jpegs(root, n=500, size=(500, 375)):
    """n JPEGs (quality 90) of smooth random content in 10 classes under root/train (and a few in root/val)."""
    rng = np.random.default_rng(0)
    for split, count in (("train", n), ("val", 20)):
        for i in range(count):
            d = os.path.join(root, split, f"c{i % 10}")
            os.makedirs(d, exist_ok=True)
            img = cv2.resize(rng.integers(0, 256, (24, 32, 3), dtype=np.uint8), size, interpolation=cv2.INTER_CUBIC)
            cv2.imwrite(os.path.join(d, f"{i}.jpg"), img, [cv2.IMWRITE_JPEG_QUALITY, 90])


def rates(config, overrides, workers, batches, rounds):
    """{workers: [images/s per round]}, the worker counts interleaved within each round."""
    out = {w: [] for w in workers}
    for _ in range(rounds):
        for w in workers:
            cfg = load_config(config, list(overrides) + [f"data.num_workers={w}"])
            _, loader = build_data(cfg, train=True)
            try:
                images, seconds = measure(loader, batches)
            finally:
                loader.close()
            out[w].append(images / seconds)
    return out


def report(title, result):
    base = statistics.median(result[min(result)])
    print(f"\n{title}\n{'workers':>8} {'images/s (median)':>18} {'vs ' + str(min(result)):>8}  rounds")
    for w, r in result.items():
        m = statistics.median(r)
        print(f"{w:>8} {m:>18.1f} {m / base:>8.2f}  {' '.join(f'{x:.0f}' for x in r)}")


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("config", nargs="?")
    p.add_argument("overrides", nargs="*")
    p.add_argument("--workers", default="0,1,2")
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    workers = [int(w) for w in args.workers.split(",")]
    print(f"CPUs available: {len(os.sched_getaffinity(0))}, load average {os.getloadavg()[0]:.1f}")
    if args.config:
        report(args.config, rates(args.config, args.overrides, workers, args.batches, args.rounds))
        return
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("BASEBN_DATA_CACHE", os.path.join(tmp, "cache"))
        write_jpegs(os.path.join(tmp, "folder"))
        config = os.path.join(tmp, "cfg.py")
        with open(config, "w") as f:
            f.write(FOLDER_CFG.format(root=os.path.join(tmp, "folder")))
        for title, extra in (("500 JPEGs 500x375 -> RandomResizedCrop 224 + flip, batch 32", []),
                             ("... + RandAugment rand-m9-mstd0.5", ["data.auto_augment=rand-m9-mstd0.5"])):
            report(title, rates(config, extra, workers, args.batches, args.rounds))


if __name__ == "__main__":
    main()
