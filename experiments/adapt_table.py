"""Evidence tables for test-time BN adaptation and BN recalibration at another resolution (markdown on stdout).

    .venv-corrupt/bin/python experiments/fashion_mnist_c.py --severities 5          # runs/fashion_mnist_c
    .venv/bin/python experiments/adapt_table.py --model zoo:fmnist_r20_fullres_restart2 \
        --model "configs/fmnist_resnet20.py,runs/mbnet/final.npz,model.name=mbnetv2_x050,..." \
        [--max-test-samples N] [--fixres zoo:fmnist_r20_fullres_restart2]

Adaptation table, per model: top-1 error (%) on each Fashion-MNIST-C corruption at ``--severity`` (default 5), their
mean, and on the clean test set, for ``--adapt`` none / bn_batch / adabn / tent (basebn.test.test, the function
``python -m basebn.test`` calls, with ``batch_size=200`` and the test set in its stored order; every cell starts
from the source weights, so TENT is reset per corruption as TENT's cifar10c.py does), beside TENT's CIFAR-10-C
rows (WRN-28-10, severity 5, from TENT's README: source 43.5 / norm 20.4 / tent 18.6, means over its 15
corruptions; also their mean over the corruptions evaluated here: Fashion-MNIST-C leaves frost out).

FixRes table (``--fixres zoo:NAME``): top-1 at data.image_size 28 (native), 32 and 36 (upsampled by the data
pipeline, cv2 bilinear), each with the zoo weights as they are and after ``python -m basebn.tools.recalibrate
zoo:NAME -o OUT.npz data.image_size=S`` (BN statistics re-estimated on 8192 training images at that size).

A model is ``zoo:NAME`` or ``CONFIG.py,WEIGHTS[,KEY=VALUE...]``: the config file the run was trained from with
the run's overrides (a run's config.json is not a config file basebn.config loads).
"""
import argparse
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from basebn.engine.adapt_eval import AdaptOptions  # noqa: E402
from basebn.engine.build import resolve_config  # noqa: E402
from basebn.test import test  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METHODS = ("none", "bn_batch", "adabn", "tent")
CORRUPTIONS = ("gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur", "motion_blur",
               "zoom_blur", "snow", "frost", "fog", "brightness", "contrast", "elastic_transform", "pixelate",
               "jpeg_compression")
SHORT = {"gaussian_noise": "gauss", "shot_noise": "shot", "impulse_noise": "impulse", "defocus_blur": "defocus",
         "glass_blur": "glass", "motion_blur": "motion", "zoom_blur": "zoom", "snow": "snow", "frost": "frost",
         "fog": "fog", "brightness": "bright", "contrast": "contrast", "elastic_transform": "elastic",
         "pixelate": "pixel", "jpeg_compression": "jpeg"}
# TENT's README (github DequanWang/tent), CIFAR-10-C severity 5, WRN-28-10 (RobustBench "Standard"), error %
TENT_ANCHOR = {
    "source": (43.5, (72.3, 65.7, 72.9, 46.9, 54.3, 34.8, 42.0, 25.1, 41.3, 26.0, 9.3, 46.7, 26.6, 58.5, 30.3)),
    "norm": (20.4, (28.1, 26.1, 36.3, 12.8, 35.3, 14.2, 12.1, 17.3, 17.4, 15.3, 8.4, 12.6, 23.8, 19.7, 27.3)),
    "tent": (18.6, (24.8, 23.5, 33.0, 12.0, 31.8, 13.7, 10.8, 15.9, 16.2, 13.7, 7.9, 12.1, 22.0, 17.3, 24.2)),
}
ANCHOR_METHOD = {"none": "source", "bn_batch": "norm", "tent": "tent"}


def parse_model(spec):
    """(label, config spec, weights or None, overrides) of ``zoo:NAME`` or ``CONFIG,WEIGHTS[,KEY=VALUE...]``."""
    if spec.startswith("zoo:"):
        return spec, spec, None, []
    parts = spec.split(",")
    if len(parts) < 2:
        raise SystemExit(f"error: --model {spec!r}: give zoo:NAME or CONFIG,WEIGHTS[,KEY=VALUE...]")
    names = [kv.split("=", 1)[1] for kv in parts[2:] if kv.startswith("model.name=")]
    return (f"{names[0]} ({parts[1]})" if names else parts[1]), parts[0], parts[1], parts[2:]


def top1(config, weights, overrides, method):
    """basebn.test.test's top-1 for one (data, method) cell."""
    cfg, w = resolve_config(config, overrides, weights)
    return test(cfg, w, adapt=AdaptOptions(method=method))["top1"]


def adaptation_rows(model, root, severity, corruptions, limit, log):
    """{method: {"clean": err, corruption: err, ...}} for one model."""
    label, config, weights, overrides = parse_model(model)
    base = overrides + ["batch_size=200"] + ([f"data.max_test_samples={limit}"] if limit else [])
    errors = {m: {} for m in METHODS}
    for data in ("clean", *corruptions):
        extra = [] if data == "clean" else [f"data.root={os.path.join(root, data, str(severity))}"]
        for method in METHODS:
            t0 = time.time()
            errors[method][data] = 100.0 - top1(config, weights, base + extra, method)
            log(f"{label} {data} {method}: error {errors[method][data]:.2f} ({time.time() - t0:.0f} s)")
    return errors


def adaptation_table(label, errors, corruptions):
    """Markdown: methods x (mean, clean, corruptions), then TENT's CIFAR-10-C anchor rows."""
    shown = [c for c in CORRUPTIONS if c in corruptions]
    head = (f"| {label} | mean ({len(corruptions)}) | clean | " + " | ".join(SHORT[c] for c in shown) + " |\n"
            + "| --- | ---: | ---: | " + " | ".join("---:" for _ in shown) + " |\n")
    lines = []
    for method in METHODS:
        e = errors[method]
        mean = sum(e[c] for c in corruptions) / len(corruptions)
        cells = [f"{e[c]:.1f}" if c in e else "—" for c in shown]
        lines.append(f"| {method} | **{mean:.1f}** | {e['clean']:.1f} | " + " | ".join(cells) + " |")
    for method in METHODS:
        anchor = ANCHOR_METHOD.get(method)
        if anchor is None:  # TENT's README has no AdaBN row
            continue
        mean15, per = TENT_ANCHOR[anchor]
        values = dict(zip(CORRUPTIONS, per))
        ours = sum(values[c] for c in corruptions) / len(corruptions)
        lines.append(f"| CIFAR-10-C {anchor} (TENT README) | {mean15} ({ours:.1f} on these {len(corruptions)}) | — | "
                     + " | ".join(f"{values[c]}" for c in shown) + " |")
    return head + "\n".join(lines)


def fixres_table(model, sizes, limit, out_dir, log):
    """Markdown: top-1 at each size, as trained and recalibrated at that size."""
    label, config, weights, overrides = parse_model(model)
    os.makedirs(out_dir, exist_ok=True)
    extra = [f"data.max_test_samples={limit}"] if limit else []
    rows = []
    for size in sizes:
        size_kv = [f"data.image_size={size}"]
        plain = top1(config, weights, overrides + size_kv + extra, "none")
        out = os.path.join(out_dir, f"{label.replace(':', '_').replace('/', '_')}_{size}px.npz")
        cmd = [sys.executable, "-m", "basebn.tools.recalibrate", config, *([] if weights is None else ["-w", weights]),
               "-o", out, "--force", *overrides, *size_kv]
        t0 = time.time()
        subprocess.run(cmd, cwd=REPO, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        recal = top1(config, out, overrides + size_kv + extra, "none")
        log(f"{label} {size}px: {plain:.2f} -> recalibrated {recal:.2f} ({time.time() - t0:.0f} s)")
        rows.append(f"| {size} px{' (native)' if size == 28 else ' (upsampled)'} | {plain:.2f} | {recal:.2f} | "
                    f"{recal - plain:+.2f} |")
    return (f"| {label}: test size | top-1 as trained | top-1 recalibrated at that size | gain |\n"
            "| --- | ---: | ---: | ---: |\n" + "\n".join(rows))


def main(argv=None):
    """Print the tables asked for."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", action="append", default=[], help="zoo:NAME or CONFIG,WEIGHTS[,KEY=VALUE...]")
    p.add_argument("--root", default=os.path.join(REPO, "runs", "fashion_mnist_c"))
    p.add_argument("--severity", type=int, default=5)
    p.add_argument("--corruptions", nargs="+", default=[c for c in CORRUPTIONS if c != "frost"])
    p.add_argument("--max-test-samples", type=int, default=None, help="evaluate the first N test images only")
    p.add_argument("--fixres", help="zoo:NAME (or CONFIG,WEIGHTS) for the resolution table")
    p.add_argument("--sizes", nargs="+", type=int, default=[28, 32, 36])
    p.add_argument("--fixres-dir", default=os.path.join(REPO, "runs", "fixres"))
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = p.parse_args(argv)

    def log(msg):
        if not args.quiet:
            print(msg, file=sys.stderr, flush=True)

    for model in args.model:
        errors = adaptation_rows(model, args.root, args.severity, args.corruptions, args.max_test_samples, log)
        n = args.max_test_samples or "all 10000"
        print(f"\nTop-1 error (%), Fashion-MNIST-C severity {args.severity}, {n} test images per set, batch 200:\n")
        print(adaptation_table(parse_model(model)[0], errors, args.corruptions), flush=True)
    if args.fixres:
        print()
        print(fixres_table(args.fixres, args.sizes, args.max_test_samples, args.fixres_dir, log), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
