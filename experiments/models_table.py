"""The README's Models table: name | params | MACs at the default input | default input | BN features verified.

    .venv/bin/python experiments/models_table.py [NAME ...] > /tmp/models_table.md

Builds each model (1000 classes; 10 for the 32-px CIFAR families), counts parameters and MACs with
basebn.tools.summary (one 1-image forward at the model's default input size, once per name) and names the BN features
tests/models/test_model_bn_features.py verifies on the family's representative. Takes a few minutes on CPU.
"""
import gc
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import megengine as mge  # noqa: E402

from basebn.models import build_model, list_models, model_info  # noqa: E402
from basebn.tools.summary import summarize  # noqa: E402
from tests.models.test_model_bn_features import REPRESENTATIVES, ZERO_INIT_FAMILIES  # noqa: E402

FEATURES = "E F S Fz P W"
LEGEND = ("BN features verified (tests/models/test_model_bn_features.py, on the family's smallest model, named; "
          "the EfficientNets at half width, snetv2p narrower, vgg11_bn with 64-wide fcs, hrnet_w18_small_v1 narrowed "
          "(branches 8-64 wide, 64-wide head conv), all at 8-32 px): "
          "E efficient conv-BN in eval mode (every conv->BN edge found, outputs and gradients equal), "
          "F deploy fusion, S SyncBN conversion round trip, Fz FrozenBN conversion, P precise BN, "
          "W no weight decay on norm parameters and biases, Z zero-init of the last BN gamma in residual blocks. "
          "Parameters at 1000 classes, 10 for the 32-px families; MACs for one image at the input size.")


def human(n):
    """12.3 M / 4.09 G style."""
    for unit, scale in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return str(n)


def features(family):
    """The feature codes verified for `family` and the representative they were verified on."""
    codes = FEATURES + (" Z" if family in ZERO_INIT_FAMILIES else "")
    return f"{codes} ({REPRESENTATIVES[family][0]})"


def num_classes(info):
    """10 for the 32-px (CIFAR) families, else 1000 (ImageNet)."""
    return 10 if info["input_size"] == 32 else 1000


def row(name):
    info = model_info(name)
    model = build_model(name, num_classes=num_classes(info))
    s = summarize(model, info["input_size"])
    del model
    gc.collect()
    mge._full_sync()  # free the model now (MegEngine releases deleted tensors asynchronously)
    return f"| `{name}` | {human(s['params'])} | {human(s['macs'])} | {info['input_size']} | {features(info['family'])} |"


def main(names=None):
    print("| model | params | MACs | input | BN features verified |")
    print("|---|---|---|---|---|")
    for name in names or list_models():
        print(row(name), flush=True)
    print()
    print(LEGEND)


if __name__ == "__main__":
    main(sys.argv[1:])
