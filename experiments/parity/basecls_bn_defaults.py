"""BN eps and momentum of basecls's models, for the names basebn shares (tests/fixtures/basecls_bn_defaults.json).

Run by hand with basecls's public source on PYTHONPATH (pure Python on MegEngine; basecore is in .venv):

    git -C /work/.mirror/megvii-research+basecls/repo archive HEAD | tar -x -C /tmp/basecls_src
    PYTHONPATH=/tmp/basecls_src .venv/bin/python experiments/parity/basecls_bn_defaults.py \
        --commit $(git -C /work/.mirror/megvii-research+basecls/repo rev-parse HEAD) \
        > tests/fixtures/basecls_bn_defaults.json

Each shared name is built by basecls's own model function with its defaults, and the distinct
``(eps, momentum)`` pairs of its BatchNorm modules are recorded with their count: the values a model
built from a basecls name must carry for basecls's weights to give basecls's logits
(tests/models/test_basecls_bn_defaults.py). Nothing is trained.
"""
import argparse
import gc
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import megengine as mge  # noqa: E402
import megengine.module as M  # noqa: E402
import basecls.models  # noqa: E402,F401  (fills basecls's model registry)
from basecls.utils import registers  # noqa: E402

from basebn.models import list_models  # noqa: E402

COMMAND = ("git -C /work/.mirror/megvii-research+basecls/repo archive {commit} | tar -x -C /tmp/basecls_src && "
           "PYTHONPATH=/tmp/basecls_src .venv/bin/python experiments/parity/basecls_bn_defaults.py --commit {commit}"
           " > tests/fixtures/basecls_bn_defaults.json")


def bn_settings(model):
    """{"pairs": sorted distinct [eps, momentum] of `model`'s BatchNorm modules, "count": how many there are}."""
    bns = [m for m in model.modules() if isinstance(m, M.batchnorm._BatchNorm)]
    return dict(pairs=sorted({(float(m.eps), float(m.momentum)) for m in bns}), count=len(bns))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commit", required=True, help="basecls commit the source on PYTHONPATH was exported from")
    args = parser.parse_args()
    basecls_names = {n for n in registers.models.keys() if n[0].islower()}  # functions, not the classes
    table = {}
    for name in [n for n in list_models() if n in basecls_names]:
        model = registers.models.get(name)()
        table[name] = bn_settings(model)
        del model
        gc.collect()
        mge._full_sync()  # frees the model now: MegEngine releases deleted tensors asynchronously
        print(f"{name}: {table[name]}", file=sys.stderr, flush=True)
    json.dump({"basecls_commit": args.commit, "command": COMMAND.format(commit=args.commit),
               "recorded": "distinct [eps, momentum] of the BatchNorm modules (MegEngine momentum convention) "
                           "of basecls's model function called with its defaults",
               "bn": table}, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
