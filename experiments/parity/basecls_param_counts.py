"""Parameter counts of basecls's models, for the names basebn shares (tests/fixtures/basecls_param_counts.json).

Run by hand with basecls's public source on PYTHONPATH (pure Python on MegEngine; basecore is in .venv):

    git -C /work/.mirror/megvii-research+basecls/repo archive HEAD | tar -x -C /tmp/basecls_src
    PYTHONPATH=/tmp/basecls_src .venv/bin/python experiments/parity/basecls_param_counts.py \
        --commit $(git -C /work/.mirror/megvii-research+basecls/repo rev-parse HEAD) \
        > tests/fixtures/basecls_param_counts.json

Each shared name is built with basecls's defaults (1000 classes) and its parameters counted
(``sum(p.size for p in model.parameters())``: parameters only, not buffers). ``state_dict_sha256``
hashes the sorted (key, shape) list of its state dict, so a test can check that basebn's module
names and shapes match basecls's key for key. Nothing is trained.
"""
import argparse
import gc
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import megengine as mge  # noqa: E402
import basecls.models  # noqa: E402,F401  (fills basecls's model registry)
from basecls.utils import registers  # noqa: E402

from basebn.models import list_models  # noqa: E402
from basebn.tools.summary import state_dict_sha256  # noqa: E402

COMMAND = ("git -C /work/.mirror/megvii-research+basecls/repo archive {commit} | tar -x -C /tmp/basecls_src && "
           "PYTHONPATH=/tmp/basecls_src .venv/bin/python experiments/parity/basecls_param_counts.py --commit {commit}"
           " > tests/fixtures/basecls_param_counts.json")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commit", required=True, help="basecls commit the source on PYTHONPATH was exported from")
    args = parser.parse_args()
    basecls_names = {n for n in registers.models.keys() if n[0].islower()}  # functions, not the classes
    shared = [n for n in list_models() if n in basecls_names]
    counts, hashes = {}, {}
    for name in shared:
        model = registers.models.get(name)()
        counts[name] = int(sum(p.size for p in model.parameters()))
        hashes[name] = state_dict_sha256(model)
        del model
        gc.collect()
        mge._full_sync()  # frees the model now: MegEngine releases deleted tensors asynchronously
        print(f"{name}: {counts[name]}", file=sys.stderr, flush=True)
    table = {
        "basecls_commit": args.commit,
        "command": COMMAND.format(commit=args.commit),
        "counted": "sum of sizes of model.parameters() (no buffers), num_classes=1000, basecls defaults",
        "basecls_only": sorted(basecls_names - set(shared)),
        "params": counts,
        "state_dict_sha256": hashes,
    }
    json.dump(table, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
