"""basebn.data.augment against timm: every AutoAugment/RandAugment op's argument and output, and
the per-sample train pipeline's images per CPU-second (500x375 image -> 224, RandomResizedCrop + flip +
rand-m9-mstd0.5 + normalise), measured side by side in one run.

Usage: .venv/bin/python experiments/parity/augment_vs_timm.py [--timm-python PATH] [-n N]
The timm side runs experiments/parity/timm_augment_reference.py under PATH (a Python with torch + timm;
default /tmp/convbench/torchvenv/bin/python); without one only basebn's speeds are printed.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

import cv2
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from basebn.data.augment import build_sample_transform  # noqa: E402
from basebn.data.augment.auto_augment import apply_op, op_arguments  # noqa: E402
from PIL import Image  # noqa: E402

MEAN, STD = (124.0, 116.0, 104.0), (58.0, 57.0, 57.0)
CONFIGS = {
    "crop+flip": dict(),
    "crop+flip+rand-m9-mstd0.5": dict(auto_augment="rand-m9-mstd0.5"),
    "+jitter0.4+lighting0.1+erasing0.25": dict(auto_augment="rand-m9-mstd0.5", color_jitter=0.4, lighting=0.1,
                                               random_erasing=dict(prob=0.25, mode="pixel")),
}


def jpeg_like_image(h=375, w=500, seed=0) -> np.ndarray:
    """A smooth photo-like uint8 RGB image (upsampled noise + grain), JPEG round-tripped."""
    rng = np.random.default_rng(seed)
    base = cv2.resize(rng.integers(0, 256, (12, 16, 3), dtype=np.uint8), (w, h), interpolation=cv2.INTER_CUBIC)
    grain = rng.normal(0, 8, (h, w, 3))
    img = np.clip(base + grain, 0, 255).astype(np.uint8)
    return cv2.imdecode(cv2.imencode(".jpg", img)[1], cv2.IMREAD_COLOR)


def ours_speed(img, cfg, n) -> float:
    t = build_sample_transform(cfg, True, MEAN, STD, 224)
    for i in range(20):
        t(img, np.random.default_rng(i))
    t0 = time.process_time()
    for i in range(n):
        t(img, np.random.default_rng(i))
    return n / (time.process_time() - t0)


def compare_ops(img, ref) -> int:
    """Print per-op agreement with timm; returns the number of mismatching (op, magnitude, sign)."""
    crop = Image.fromarray(img[:224, :224])
    bad = 0
    for key in sorted(k[5:] for k in ref.files if k.startswith("args|")):
        name, m, negate = key.split("|")
        args = op_arguments(name, float(m), bool(int(negate)), (224, 224))
        out = np.asarray(apply_op(crop, name, args, (124, 116, 104), Image.Resampling.BILINEAR))
        args_ok = np.allclose(np.asarray(args, np.float64), ref["args|" + key])
        diff = np.abs(out.astype(int) - ref["img|" + key].astype(int)).max()
        if not args_ok or diff:
            bad += 1
            print(f"  MISMATCH {key}: args {args} vs timm {ref['args|' + key]}, max pixel diff {diff}")
    return bad


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--timm-python", default="/tmp/convbench/torchvenv/bin/python")
    ap.add_argument("-n", type=int, default=300)
    args = ap.parse_args(argv)
    img = jpeg_like_image()
    cv2.setNumThreads(1)
    speeds = {name: ours_speed(img, cfg, args.n) for name, cfg in CONFIGS.items()}
    timm = None
    if os.path.exists(args.timm_python):
        with tempfile.TemporaryDirectory() as tmp:
            np.save(os.path.join(tmp, "img.npy"), img)
            script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "timm_augment_reference.py")
            subprocess.run([args.timm_python, script, os.path.join(tmp, "img.npy"), os.path.join(tmp, "ref.npz")],
                           check=True)
            timm = dict(np.load(os.path.join(tmp, "ref.npz")))
            ref = np.load(os.path.join(tmp, "ref.npz"))
            n_cases = sum(k.startswith("args|") for k in ref.files)
            bad = compare_ops(img, ref)
            print(f"ops vs timm: {n_cases - bad}/{n_cases} (op, magnitude, sign) cases identical "
                  f"(arguments and every pixel)")
    print("per-sample train transform, 500x375 uint8 -> 224 float32, one thread "
          "(images per CPU-second, so other load on the machine matters less):")
    for name, s in speeds.items():
        print(f"  basebn {name:40s} {s:8.0f}")
    if timm is not None:
        ts = float(timm["speed"])
        ratio = speeds["crop+flip+rand-m9-mstd0.5"] / ts
        print(f"  timm   {'crop+flip+rand-m9-mstd0.5 (PIL, torch)':40s} {ts:8.0f}")
        print(f"  basebn / timm (same pipeline): {ratio:.2f}x")


if __name__ == "__main__":
    main()
