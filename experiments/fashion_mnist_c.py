"""Write Fashion-MNIST-C: the Fashion-MNIST test set under the ImageNet-C corruptions (Hendrycks & Dietterich 2019).

    .venv-corrupt/bin/python experiments/fashion_mnist_c.py --out runs/fashion_mnist_c [--severities 5]
    .venv/bin/python -m basebn.test zoo:fmnist_r20 data.root=runs/fashion_mnist_c/gaussian_noise/5 --adapt tent

Each (corruption, severity) is one folder OUT/<corruption>/<severity>/ that ``data.root`` can point at: the corrupted
test images as t10k-images-idx3-ubyte.gz (10000 x 28 x 28, stored order), the original test labels, and the training
files as symlinks to the originals (so tools that also read the train split, e.g. basebn.tools.recalibrate, accept
the folder). OUT/manifest.json records the package and versions, the seeds, and the corruptions left out and why.

The corruptions are those of the PyPI package ``imagecorruptions`` 1.1.2 (bethgelab, Michaelis et al. 2019: the
ImageNet-C code of Hendrycks & Dietterich packaged, with their 224-px constants), called per image, unmodified. Its
``corrupt()`` wrapper refuses images under 32 px; the corruption functions themselves work at 28 px, so they are
called directly (``imagecorruptions.corruption_dict``), exactly as ``corrupt()`` does after its checks: the grey
image stacked to 3 channels, a PIL RGB image in, ``np.uint8(result)`` out. Back to grey: channel 0. For the noises
each channel is an independent draw, so channel 0 is the greyscale corruption with its own statistics (a luma mix
of three channels would shrink the noise); for the others the three channels stay equal for a grey input.

Runs in the benchmark venv .venv-corrupt (CPython 3.10, numpy<2, scikit-image 0.19.3: imagecorruptions 1.1.2 calls
skimage's gaussian(multichannel=True), removed in scikit-image 0.20, and pkg_resources, removed in setuptools 81):
    $(scripts/find_python310.sh) -m venv .venv-corrupt
    .venv-corrupt/bin/pip install "numpy<2" "scikit-image==0.19.3" "scipy<1.14" "opencv-python<4.11" pillow \
        "setuptools<81" imagecorruptions==1.1.2
Needs no basebn import (the IDX files are read and written here with numpy); about a minute per severity on one
core (most of it glass blur's per-pixel loop).
"""
import argparse
import gzip
import json
import os
import sys
import time
import warnings

import numpy as np

FASHION_MNIST_ROOT = "/usr/share/datasets/fashion-mnist"  # Debian's dataset-fashion-mnist
TEST_IMAGES, TEST_LABELS = "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"
TRAIN_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte")

# ImageNet-C's 15 benchmark corruptions in its order (imagecorruptions.get_corruption_names("common")).
COMMON = ("gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur", "motion_blur", "zoom_blur",
          "snow", "frost", "fog", "brightness", "contrast", "elastic_transform", "pixelate", "jpeg_compression")
EXCLUDED = {
    "frost": "blends a crop of a colour frost photograph (315x560 to 600x900 px, scaled x1.1) at the image's size: a "
             "28-px window is a patch of single ice crystals, not a frosted texture (CIFAR-10-C shrinks the photos 5x "
             "for 32 px; imagecorruptions has no such scale), and the photo's colour has no greyscale counterpart",
    "speckle_noise": "an ImageNet-C validation corruption, not one of the 15 benchmark corruptions (as TENT's tables)",
    "gaussian_blur": "an ImageNet-C validation corruption, not one of the 15 benchmark corruptions (as TENT's tables)",
    "spatter": "an ImageNet-C validation corruption; also colour (its water/mud tints) added to a grey image",
    "saturate": "an ImageNet-C validation corruption; also the identity on a grey image (saturation 0)",
}
APPLICABLE = tuple(c for c in COMMON if c not in EXCLUDED)


def read_idx(path):
    """One IDX file (gzipped or not) as a native-endian uint8 numpy array (the Fashion-MNIST files are uint8)."""
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    if raw[:3] != b"\x00\x00\x08":
        raise SystemExit(f"error: {path} is not an unsigned-byte IDX file (magic 0x{raw[:4].hex()})")
    ndim = raw[3]
    dims = tuple(int(d) for d in np.frombuffer(raw, ">u4", ndim, 4))
    return np.frombuffer(raw, np.uint8, int(np.prod(dims)), 4 + 4 * ndim).reshape(dims)


def write_idx_gz(path, arr):
    """``arr`` (uint8) as a gzipped IDX file."""
    arr = np.ascontiguousarray(arr, dtype=np.uint8)
    data = bytes([0, 0, 0x08, arr.ndim]) + np.asarray(arr.shape, ">u4").tobytes() + arr.tobytes()
    with open(path, "wb") as f:
        f.write(gzip.compress(data, compresslevel=6))


def find_file(root, stem):
    """``root/stem`` or ``root/stem.gz``, whichever exists."""
    for name in (stem, stem + ".gz"):
        if os.path.isfile(os.path.join(root, name)):
            return os.path.join(root, name)
    raise SystemExit(f"error: {stem}[.gz] not found in {root}; install Debian's dataset-fashion-mnist or pass --src")


def corrupt_grey(images, name, severity, seed):
    """``images`` (N, 28, 28) uint8 under imagecorruptions' ``name`` at ``severity``; numpy's global RNG (the one the
    package draws from) seeded with ``seed`` first, so a folder is reproducible."""
    from imagecorruptions import corruption_dict
    from PIL import Image

    fn = corruption_dict[name]
    np.random.seed(seed)
    out = np.empty_like(images)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy.ndimage.interpolation / skimage deprecation chatter
        for i, img in enumerate(images):
            rgb = np.repeat(img[:, :, None], 3, axis=2)
            result = np.uint8(fn(Image.fromarray(rgb), severity))  # as corrupt(): truncation to uint8
            out[i] = result[..., 0] if result.ndim == 3 else result
    return out


def _link_or_copy(src, dst):
    if os.path.lexists(dst):
        os.remove(dst)
    try:
        os.symlink(os.path.abspath(src), dst)
    except OSError:
        import shutil
        shutil.copyfile(src, dst)


def write_folder(folder, images, labels_path, src_root):
    """One ``data.root`` folder: corrupted test images, the original test labels, the train files linked."""
    os.makedirs(folder, exist_ok=True)
    write_idx_gz(os.path.join(folder, TEST_IMAGES + ".gz"), images)
    _link_or_copy(labels_path, os.path.join(folder, os.path.basename(labels_path)))
    for stem in TRAIN_FILES:
        path = find_file(src_root, stem)
        _link_or_copy(path, os.path.join(folder, os.path.basename(path)))


def parse_args(argv):
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="runs/fashion_mnist_c", help="output folder (default runs/fashion_mnist_c)")
    p.add_argument("--src", default=FASHION_MNIST_ROOT, help=f"Fashion-MNIST IDX folder (default {FASHION_MNIST_ROOT})")
    p.add_argument("--corruptions", nargs="+", default=list(APPLICABLE), metavar="NAME",
                   help=f"default: the {len(APPLICABLE)} that apply to 28x28 grey ({', '.join(APPLICABLE)})")
    p.add_argument("--severities", nargs="+", type=int, default=[1, 2, 3, 4, 5], choices=[1, 2, 3, 4, 5])
    p.add_argument("--seed", type=int, default=0, help="base seed; folder (corruption c, severity s) uses "
                                                        "seed + 100 * index(c in ImageNet-C order) + s")
    p.add_argument("--force", action="store_true", help="rewrite folders that already exist")
    return p.parse_args(argv)


def main(argv=None):
    """Write the folders asked for and OUT/manifest.json; print one line per folder."""
    args = parse_args(argv)
    import imagecorruptions
    from imagecorruptions import corruption_dict

    unknown = [c for c in args.corruptions if c not in corruption_dict]
    if unknown:
        raise SystemExit(f"error: unknown corruption(s) {', '.join(unknown)}; imagecorruptions has "
                         f"{', '.join(corruption_dict)}")
    images = read_idx(find_file(args.src, TEST_IMAGES))
    labels_path = find_file(args.src, TEST_LABELS)
    if read_idx(labels_path).shape[0] != images.shape[0]:
        raise SystemExit(f"error: {args.src}: test images and labels differ in count")
    manifest_path = os.path.join(args.out, "manifest.json")
    manifest = {}
    if os.path.isfile(manifest_path):
        with open(manifest_path) as f:
            manifest = json.load(f)
    import PIL
    import scipy
    import skimage
    manifest.update({
        "package": f"imagecorruptions {getattr(imagecorruptions, '__version__', '1.1.2')}",
        "versions": {"numpy": np.__version__, "scipy": scipy.__version__, "scikit-image": skimage.__version__,
                     "pillow": PIL.__version__, "python": sys.version.split()[0]},
        "source": os.path.abspath(args.src), "images": int(images.shape[0]),
        "grey": "3-channel stack in, channel 0 out", "excluded": EXCLUDED})
    folders = manifest.setdefault("folders", {})
    for name in args.corruptions:
        order = COMMON.index(name) if name in COMMON else len(COMMON) + list(corruption_dict).index(name)
        for severity in args.severities:
            folder = os.path.join(args.out, name, str(severity))
            if os.path.isfile(os.path.join(folder, TEST_IMAGES + ".gz")) and not args.force:
                print(f"{folder}: exists (--force rewrites it)", flush=True)
                continue
            seed = args.seed + 100 * order + severity
            t0 = time.time()
            corrupted = corrupt_grey(images, name, severity, seed)
            write_folder(folder, corrupted, labels_path, args.src)
            diff = np.abs(corrupted.astype(np.int16) - images).mean()
            folders[f"{name}/{severity}"] = {"seed": seed, "mean_abs_change": round(float(diff), 2)}
            print(f"{folder}: seed {seed}, mean |change| {diff:.1f} grey levels, {time.time() - t0:.0f} s", flush=True)
            os.makedirs(args.out, exist_ok=True)
            with open(manifest_path, "w") as f:
                json.dump(manifest, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
