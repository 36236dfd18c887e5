"""basebn's half of experiments/parity/tent_parity.py (runs in basebn's venv): the test batches and basebn's TENT logits.

    .venv/bin/python experiments/parity/tent_parity_basebn.py zoo:fmnist_r20 DATA_ROOT OUT.npz [--batch-size 200]

Builds the zoo entry's test loader with ``data.root=DATA_ROOT batch_size=B`` (the entry's own test preprocessing,
the test set in its stored order) and writes OUT.npz: ``images`` (N, C, H, W) float32 exactly as the model sees
them, ``labels``, ``batch_size``, the model's shape settings (``stem_stride``, ``base_width``, ``bn_eps``,
``model_name``, ``weights_file``: the zoo .npz), and the logits of ``basebn.engine.adapt.tent`` (TENT's CIFAR-10-C
setting: Adam, lr 1e-3, 1 step) and of the plain eval-mode model (``source_logits``), batch by batch.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from basebn.engine.adapt import predict, prepare_for_adaptation, tent  # noqa: E402
from basebn.engine.build import load_trained, resolve_config  # noqa: E402
from basebn.layers.norm import is_bn2d  # noqa: E402
from basebn.zoo.index import get_entry, zoo_weights_path  # noqa: E402


def main(argv=None):
    """Write OUT.npz (see the module doc)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("spec", help="zoo:NAME")
    p.add_argument("data_root")
    p.add_argument("out")
    p.add_argument("--batch-size", type=int, default=200)
    args = p.parse_args(argv)
    if not args.spec.startswith("zoo:"):
        raise SystemExit("error: give a zoo entry as zoo:NAME (its weights file is what the torch side loads)")
    name = args.spec[4:]
    cfg, weights = resolve_config(args.spec, [f"data.root={args.data_root}", f"batch_size={args.batch_size}"], None)
    if cfg.model.name != "resnet20" or cfg.model.stem != "small":
        raise SystemExit(f"error: {name} is {cfg.model.name} (stem {cfg.model.stem}); the torch transcription is "
                         f"ResNet-20 with the small stem only")
    model, _, loader = load_trained(cfg, weights)
    batches, labels = [], []
    for images, y, *_ in loader:
        batches.append(np.asarray(images, dtype=np.float32))
        labels.append(np.asarray(y))
    model = prepare_for_adaptation(model)
    eps = sorted({float(m.eps) for m in model.modules() if is_bn2d(m)})
    source = np.concatenate(list(predict(model, batches)))
    adapted = np.concatenate(list(tent(model, batches, lr=1e-3, steps=1, optimizer="adam")))
    np.savez(args.out, images=np.concatenate(batches), labels=np.concatenate(labels), batch_size=args.batch_size,
             stem_stride=int(cfg.model.stem_stride), base_width=int(cfg.model.base_width or 16),
             bn_eps=np.asarray(eps), model_name=cfg.model.name, weights_file=zoo_weights_path(get_entry(name)),
             weights_sha256=get_entry(name)["sha256"], tent_logits=adapted, source_logits=source)
    return 0


if __name__ == "__main__":
    sys.exit(main())
