"""Evidence for test-time BN adaptation (Fashion-MNIST-C) and BN recalibration at another resolution.

    .venv-corrupt/bin/python experiments/fashion_mnist_c.py --out runs/fashion_mnist_c --severities 3 5
    .venv/bin/python experiments/adapt_table.py --model zoo:fmnist_r20_fullres_restart2 \
        [--model "configs/fmnist_resnet20.py,runs/mbnet/final.npz,model.name=mbnetv2_x050,..."] \
        [--severities 5 3] [--batch-sizes 200 64] [--max-test-samples N] --results results/fmnist_c.json
    .venv/bin/python experiments/adapt_table.py --fixres zoo:fmnist_r20_fullres_restart2 [--max-test-samples N]

Adaptation table, per model, severity and test batch: top-1 error (%) on each Fashion-MNIST-C corruption, their
mean, and on the clean test set, for ``--adapt`` none / bn_batch / adabn / tent (basebn.test.test, the function
``python -m basebn.test`` calls, with ``test_batch_size=B``: the batch bn_batch and tent normalise over; the test set
in its stored order; every cell starts from the source weights, so TENT is reset per corruption as TENT's
cifar10c.py does). The work runs severity by severity, batch by batch, in the order given, so the first ones finish
first. Each cell's error is kept in OUT/<model>/s<severity>/b<batch>/<method>/<corruption>.json (the clean cells,
the same for every severity, in OUT/<model>/clean/b<batch>/<method>/clean.json) and reused when the images and
overrides match, so an interrupted table continues; ``--budget-minutes`` stops starting cells after that long, and
the figures then hold the cells done (a mean only where all its corruptions are). The figures (JSON on stdout, and
appended to ``--results``, where scripts/make_figures.py renders them) also carry TENT's CIFAR-10-C rows as a
scale reference (WRN-28-10, severity 5, from TENT's README: source 43.5 / norm 20.4 / tent 18.6, means over its 15
corruptions).

FixRes table (``--fixres zoo:NAME``, markdown on stdout): top-1 at data.image_size 28 (native), 32 and 36
(upsampled by the data pipeline, cv2 bilinear), each with the zoo weights as they are and after ``python -m
basebn.tools.recalibrate zoo:NAME -o OUT.npz data.image_size=S`` (BN statistics re-estimated on 8192 training images
at that size).

A model is ``zoo:NAME`` or ``CONFIG.py,WEIGHTS[,KEY=VALUE...]``: the config file the run was trained from with
the run's overrides (a run's config.json is not a config file basebn.config loads).
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from basebn.engine.adapt_eval import AdaptOptions  # noqa: E402
from basebn.engine.build import resolve_config  # noqa: E402
from basebn.test import test  # noqa: E402
from benchmarks.results_file import add_results_argument, default_threads, save_run  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METHODS = ("none", "bn_batch", "adabn", "tent")
CORRUPTIONS = ("gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur", "motion_blur",
               "zoom_blur", "snow", "frost", "fog", "brightness", "contrast", "elastic_transform", "pixelate",
               "jpeg_compression")
# TENT's README (github DequanWang/tent), CIFAR-10-C severity 5, WRN-28-10 (RobustBench "Standard"), error %
TENT_ANCHOR = {
    "source": (43.5, (72.3, 65.7, 72.9, 46.9, 54.3, 34.8, 42.0, 25.1, 41.3, 26.0, 9.3, 46.7, 26.6, 58.5, 30.3)),
    "norm": (20.4, (28.1, 26.1, 36.3, 12.8, 35.3, 14.2, 12.1, 17.3, 17.4, 15.3, 8.4, 12.6, 23.8, 19.7, 27.3)),
    "tent": (18.6, (24.8, 23.5, 33.0, 12.0, 31.8, 13.7, 10.8, 15.9, 16.2, 13.7, 7.9, 12.1, 22.0, 17.3, 24.2)),
}
TEST_IMAGES = 10000  # the Fashion-MNIST test set, and each Fashion-MNIST-C set
APPLICABLE = tuple(c for c in CORRUPTIONS if c != "frost")  # frost: no 28-px greyscale counterpart (manifest.json)


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


def cell_path(out, label, severity, batch, method, data):
    """Where one cell's result is kept: the clean cells (the same at every severity) once per batch."""
    model = re.sub(r"[^\w.-]+", "_", label).strip("_")
    group = "clean" if data == "clean" else f"s{severity}"
    return os.path.join(out, model, group, f"b{batch}", method, f"{data}.json")


def run_cell(path, config, weights, overrides, method, images, measure=True):
    """({"error", "images", "seconds", "overrides"}, measured now) of one cell: read from ``path`` when it holds the
    same images and overrides, else measured and written there (through a temporary file, so an interrupted write
    leaves none); (None, False) when it is not kept and ``measure`` is False."""
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            kept = json.load(f)
        if kept.get("images") == images and kept.get("overrides") == overrides:
            return kept, False
    if not measure:
        return None, False
    t0 = time.time()
    m = test(*resolve_config(config, overrides, weights), adapt=AdaptOptions(method=method))
    result = {"error": round(100.0 - m["top1"], 2), "images": int(m["images"]), "seconds": round(time.time() - t0, 1),
              "overrides": overrides}
    if result["images"] != images:
        raise SystemExit(f"error: {path}: evaluated {result['images']} images, expected {images}")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(result, f)
    os.replace(path + ".tmp", path)
    return result, True


def adaptation_cells(model, args, log, deadline):
    """{(severity, batch, method, data): cell} for one model, severity by severity and batch by batch in the order
    asked for; cells not kept are measured until ``deadline`` (time.time()), and left out after it."""
    label, config, weights, overrides = parse_model(model)
    images = min(args.max_test_samples or TEST_IMAGES, TEST_IMAGES)
    limit = [f"data.max_test_samples={args.max_test_samples}"] if args.max_test_samples else []
    cells = {}
    for severity in args.severities:
        for batch in args.batch_sizes:
            for data in ("clean", *args.corruptions):
                root = [] if data == "clean" else [f"data.root={os.path.join(args.root, data, str(severity))}"]
                for method in METHODS:
                    path = cell_path(args.out, label, severity, batch, method, data)
                    cell, measured = run_cell(path, config, weights, overrides + [f"test_batch_size={batch}"]
                                              + limit + root, method, images,
                                              measure=deadline is None or time.time() < deadline)
                    if cell is None:
                        continue
                    cells[severity, batch, method, data] = cell
                    if measured:
                        log(f"{label} s{severity} b{batch} {data} {method}: error {cell['error']:.2f} "
                            f"({cell['seconds']:.0f} s)")
    return cells


def adaptation_figures(label, cells, args):
    """{label: {"severity S": {"batch B": {method: {"clean": e, "mean": e, corruption: e, ...}}}}}: every cell asked
    for, None where it has not run; "mean" over the corruptions, None until all of them have."""
    out = {}
    for severity in args.severities:
        for batch in args.batch_sizes:
            by_method = out.setdefault(f"severity {severity}", {}).setdefault(f"batch {batch}", {})
            for method in METHODS:
                row = {d: cells[severity, batch, method, d]["error"] if (severity, batch, method, d) in cells else None
                       for d in ("clean", *args.corruptions)}
                done = [row[c] for c in args.corruptions if row[c] is not None]
                mean = round(sum(done) / len(done), 2) if len(done) == len(args.corruptions) else None
                by_method[method] = {"clean": row.pop("clean"), "mean": mean, **row}
    return {label: out}


def anchor_figures(corruptions):
    """TENT's CIFAR-10-C rows: {anchor: {"mean_15": TENT's mean, "mean": over ``corruptions``, corruption: e}}."""
    out = {}
    for anchor, (mean15, per) in TENT_ANCHOR.items():
        values = dict(zip(CORRUPTIONS, per))
        out[anchor] = {"mean_15": mean15, "mean": round(sum(values[c] for c in corruptions) / len(corruptions), 2),
                       **{c: values[c] for c in CORRUPTIONS if c in corruptions}}
    return out


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


def _positive(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive whole number")
    return value


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", action="append", default=[], help="zoo:NAME or CONFIG,WEIGHTS[,KEY=VALUE...]")
    p.add_argument("--root", default=os.path.join(REPO, "runs", "fashion_mnist_c"),
                   help="experiments/fashion_mnist_c.py's output folder")
    p.add_argument("--severities", nargs="+", type=int, choices=range(1, 6), default=[5, 3],
                   help="Fashion-MNIST-C severities, in the order they run (default 5 3)")
    p.add_argument("--batch-sizes", nargs="+", type=_positive, default=[200, 64],
                   help="test batches (test_batch_size), in the order they run (default 200 64)")
    p.add_argument("--corruptions", nargs="+", choices=APPLICABLE, default=list(APPLICABLE))
    p.add_argument("--max-test-samples", type=_positive, default=None,
                   help="evaluate a fixed subset of N test images (data.max_test_samples; default: all 10000)")
    p.add_argument("--out", default=os.path.join(REPO, "runs", "adapt_table"), help="the kept cells' folder")
    p.add_argument("--budget-minutes", type=float, default=None,
                   help="start no cell after this many minutes; the figures hold the cells done")
    p.add_argument("--fixres", help="zoo:NAME (or CONFIG,WEIGHTS) for the resolution table")
    p.add_argument("--sizes", nargs="+", type=int, default=[28, 32, 36])
    p.add_argument("--fixres-dir", default=os.path.join(REPO, "runs", "fixres"))
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    add_results_argument(p)
    args = p.parse_args(argv)
    args.corruptions = [c for c in CORRUPTIONS if c in args.corruptions]  # the table's column order
    if args.model:
        for severity in args.severities:
            missing = [c for c in args.corruptions if not os.path.isdir(os.path.join(args.root, c, str(severity)))]
            if missing:
                p.error(f"{args.root} has no severity {severity} of {', '.join(missing)}: run "
                        f"experiments/fashion_mnist_c.py --out {args.root} --severities {severity}")
        for model in args.model:
            parse_model(model)
    return args


def main(argv=None):
    """Measure the tables asked for: the adaptation figures (JSON, and --results), the FixRes table (markdown)."""
    args = parse_args(argv)

    def log(msg):
        if not args.quiet:
            print(msg, file=sys.stderr, flush=True)

    start = time.time()
    deadline = start + 60 * args.budget_minutes if args.budget_minutes is not None else None
    models, seconds, missing = {}, {}, 0
    for model in args.model:
        label = parse_model(model)[0]
        cells = adaptation_cells(model, args, log, deadline)
        models.update(adaptation_figures(label, cells, args))
        expected = len(args.batch_sizes) * len(METHODS) * (1 + len(args.severities) * len(args.corruptions))
        missing += expected - len({(s if d != "clean" else 0, b, m, d) for s, b, m, d in cells})
        for (severity, batch, method, data), cell in cells.items():
            key = (label, "clean" if data == "clean" else f"severity {severity}", f"batch {batch}", method)
            seconds.setdefault(key, {})[data] = cell["seconds"]
    if args.model:
        figures = {"models": models, "tent_cifar10c": anchor_figures(args.corruptions)}
        print(json.dumps(figures), flush=True)
        machine = sum(sum(v.values()) for v in seconds.values())
        per_method = {m: round(sum(sum(v.values()) for k, v in seconds.items() if k[3] == m)
                               / max(1, sum(len(v) for k, v in seconds.items() if k[3] == m)), 1) for m in METHODS}
        images = min(args.max_test_samples or TEST_IMAGES, TEST_IMAGES)
        conditions = {
            "images_per_set": images,
            "corruptions": args.corruptions,
            "cells_missing": missing,
            "machine_minutes": round(machine / 60, 1),
            "seconds_per_cell": per_method,
            "commands": [".venv-corrupt/bin/python experiments/fashion_mnist_c.py --out runs/fashion_mnist_c "
                         f"--severities {' '.join(map(str, sorted(args.severities)))}",
                         shlex.join(["experiments/adapt_table.py", *(sys.argv[1:] if argv is None else argv)])],
        }
        log(f"adaptation cells: {machine / 60:.1f} min of machine time in all, {missing} cell(s) not run")
        save_run(args.results, "experiments/adapt_table.py", "table", default_threads(), figures,
                 "Test-time BN adaptation (none / bn_batch / AdaBN / TENT) on Fashion-MNIST-C",
                 conditions=conditions, argv=argv)
    if args.fixres:
        print()
        print(fixres_table(args.fixres, args.sizes, args.max_test_samples, args.fixres_dir, log), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
