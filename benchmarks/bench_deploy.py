"""Inference speed of a deployed model: images/s of eager basebn, the eager fused model, the .mge graph in
MegEngine Lite (1 and 2 threads) and ONNX in onnxruntime (1 and 2 threads), side by side in one run.

Variants are called round-robin (interleaved, so load from other processes hits all alike) and each
reports its median time per call over --reps calls after one warm-up call; the table gives
images/s = batch / median and the speed-up over eager basebn. Models (weights do not change speed):

    resnet20       1x28x28, the zoo's fmnist_r20_fullres_restart2 (ResNet-20 width 16), batch 1 and 256
    resnet50       3x224x224, 1000 classes, batch 1 and 32 (256 at 224 px takes minutes per call on 2 cores)
    mbnetv2_x100   3x224x224, 1000 classes, batch 1 and 32

    python benchmarks/bench_deploy.py [--models resnet20 resnet50 mbnetv2_x100] [--reps 5] [--results FILE]

``--results FILE`` appends the images/s and the speed-ups over eager basebn per model, batch and variant.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import megengine as mge  # noqa: E402

from basebn.cli import quiet_device_probe  # noqa: E402
from basebn.deploy import export_mge, export_onnx, load_exported, prepare_for_export  # noqa: E402
from basebn.engine.build import build_model_from_cfg, zoo_config  # noqa: E402
from basebn.models import build_model, load_weights  # noqa: E402
from results_file import add_results_argument, default_threads, save_run  # noqa: E402

ZOO_ENTRY = "fmnist_r20_fullres_restart2"
SETUPS = {  # name: (input shape C, H, W; batch sizes)
    "resnet20": ((1, 28, 28), (1, 256)),
    "resnet50": ((3, 224, 224), (1, 32)),
    "mbnetv2_x100": ((3, 224, 224), (1, 32)),
}


def build(name):
    """The eager eval model: the zoo entry for resnet20, a fresh 1000-class model otherwise."""
    if name == "resnet20":
        model = build_model_from_cfg(zoo_config(ZOO_ENTRY), in_channels=1)
        load_weights(model, "zoo:" + ZOO_ENTRY)
    else:
        model = build_model(name, num_classes=1000)
    model.eval()
    return model


def variants(model, shape, tmp):
    """{variant name: callable(images) -> logits numpy}."""
    mge_path, onnx_path = os.path.join(tmp, "m.mge"), os.path.join(tmp, "m.onnx")
    export_mge(model, mge_path, (2, *shape))
    export_onnx(model, onnx_path, (2, *shape))
    fused = prepare_for_export(model, np.zeros((2, *shape), np.float32))
    return {
        "eager basebn": lambda x: model(mge.tensor(x)).numpy(),
        "eager fused": lambda x: fused(mge.tensor(x)).numpy(),
        "Lite 1 thread": load_exported(mge_path, "lite", threads=1),
        "Lite 2 threads": load_exported(mge_path, "lite", threads=2),
        "onnxruntime 1 thread": load_exported(onnx_path, "onnxruntime", threads=1),
        "onnxruntime 2 threads": load_exported(onnx_path, "onnxruntime", threads=2),
    }


def measure(runs, images, reps):
    """{variant: median seconds per call}, calls interleaved round-robin after one warm-up each."""
    times = {k: [] for k in runs}
    for run in runs.values():
        run(images)
    for _ in range(reps):
        for k, run in runs.items():
            t0 = time.perf_counter()
            run(images)
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="*", default=list(SETUPS), choices=list(SETUPS))
    p.add_argument("--reps", type=int, default=5)
    add_results_argument(p)
    args = p.parse_args()
    figures = {"images_per_s": {}, "over_eager_basebn": {}}
    quiet_device_probe()
    print(f"medians of {args.reps} interleaved calls; CPU threads available: {os.cpu_count()}")
    print("| model | input | batch | variant | images/s | vs eager basebn |")
    print("|---|---|---|---|---:|---:|")
    for name in args.models:
        shape, batches = SETUPS[name]
        model = build(name)
        with tempfile.TemporaryDirectory() as tmp:
            runs = variants(model, shape, tmp)
            for batch in batches:
                images = np.random.default_rng(0).standard_normal((batch, *shape)).astype(np.float32)
                medians = measure(runs, images, args.reps)
                base = medians["eager basebn"]
                for k, t in medians.items():
                    print(f"| {name} | {'x'.join(map(str, shape))} | {batch} | {k} | {batch / t:.1f} | "
                          f"{base / t:.2f}x |", flush=True)
                    figures["images_per_s"].setdefault(name, {}).setdefault(str(batch), {})[k] = round(batch / t, 1)
                    figures["over_eager_basebn"].setdefault(name, {}).setdefault(str(batch), {})[k] = \
                        round(base / t, 3)
    save_run(args.results, "benchmarks/bench_deploy.py", "deploy", default_threads(), figures,
             "inference speed of a deployed model: eager basebn, eager fused, MegEngine Lite and onnxruntime",
             conditions=f"medians of {args.reps} interleaved calls per variant")
    return 0


if __name__ == "__main__":
    sys.exit(main())
