"""docs/models.md's table: name | params | MACs at the default input | default input | BN features verified.

    .venv/bin/python experiments/models_table.py [NAME ...] > /tmp/models_table.md
    .venv/bin/python experiments/models_table.py --results results/models.json   # docs/models.md's table

Builds each model (1000 classes; 10 for the 32-px CIFAR families), counts parameters and MACs with
basebn.tools.summary (one 1-image forward at the model's default input size, once per name) and names the BN features
tests/models/test_model_bn_features.py verifies on the family's representative. Takes a few minutes on CPU.
"""
import argparse
import gc
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import megengine as mge  # noqa: E402

from basebn.models import build_model, list_models, model_info  # noqa: E402
from basebn.tools.summary import summarize  # noqa: E402
from benchmarks.results_file import add_results_argument, default_threads, save_run  # noqa: E402
from scripts.experiment_tables import MODELS_HEAD, model_row  # noqa: E402
from tests.models.test_model_bn_features import REPRESENTATIVES, ZERO_INIT_FAMILIES  # noqa: E402

FEATURES = "E F S Fz P W"
LEGEND = ("BN features verified (tests/models/test_model_bn_features.py, on the family's smallest model, named; "
          "the EfficientNets at half width, snetv2p narrower, vgg11_bn with 64-wide fcs, hrnet_w18_small_v1 narrowed "
          "(branches 8-64 wide, 64-wide head conv), all at 8-32 px): "
          "E efficient conv-BN in eval mode (every conv->BN edge found, outputs and gradients equal), "
          "F deploy fusion, S SyncBN conversion round trip, Fz FrozenBN conversion, P precise BN, "
          "W no weight decay on norm parameters and biases, Z zero-init of the last BN gamma in residual blocks. "
          "Parameters at 1000 classes, 10 for the 32-px families; MACs for one image at the input size.")


def num_classes(info):
    """10 for the 32-px (CIFAR) families, else 1000 (ImageNet)."""
    return 10 if info["input_size"] == 32 else 1000


def measure(name):
    """{"params", "macs", "input", "features", "verified_on"} of one model (its results-file entry)."""
    info = model_info(name)
    model = build_model(name, num_classes=num_classes(info))
    s = summarize(model, info["input_size"])
    del model
    gc.collect()
    mge._full_sync()  # free the model now (MegEngine releases deleted tensors asynchronously)
    family = info["family"]
    return {"params": int(s["params"]), "macs": int(s["macs"]), "input": info["input_size"],
            "features": FEATURES + (" Z" if family in ZERO_INIT_FAMILIES else ""),
            "verified_on": REPRESENTATIVES[family][0]}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*", metavar="NAME", help="these models only (default: every name)")
    add_results_argument(p)
    args = p.parse_args(argv)
    if args.results and args.names:
        p.error("--results records the whole table: give no model names with it")
    print("\n".join(MODELS_HEAD))
    models = {}
    for name in args.names or list_models():
        models[name] = measure(name)
        print(model_row(name, models[name]), flush=True)
    print()
    print(LEGEND)
    save_run(args.results, "experiments/models_table.py", "table", default_threads(),
             {"count": len(models), "models": models},
             "parameters and MACs of every model name, and the BN features verified on its family",
             conditions="Parameters at 1000 classes (10 for the 32-px CIFAR families); MACs for one image at the "
                        "model's default input size; counted by basebn.tools.summary")


if __name__ == "__main__":
    main()
