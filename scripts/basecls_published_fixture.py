"""The basecls:NAME test fixture: a weights file in basecls's published format, written by basecls's own code.

basecls's smallest model, ``mbnetv1_x025``, with a 10-class head (0.9 MB instead of 1.9 MB; the test builds
basebn's with num_classes=10) gets seeded random weights and BN statistics (weights_parity.random_state), then
basecls writes it as its training does (``mge.save({"state_dict": ...})``, CheckpointHook.after_train's
dumped_model.pkl) and turns it into a published zoo file with its own ``basecls.zoo.utils.purify_weight``. The
file lands where basecls's URL puts it under the prefix (mbnet/mbnetv1_x025/mbnetv1_x025.pkl), so the test
serves the folder as the mirror. basecls's model also computes its logits on the BGR image whose RGB version
the test gives basebn (basecls's pipeline decodes BGR). Run by hand, once:

    git -C /work/.mirror/megvii-research+basecls/repo archive HEAD | tar -x -C /tmp/basecls_src
    PYTHONPATH=/tmp/basecls_src .venv/bin/python scripts/basecls_published_fixture.py \
        --commit $(git -C /work/.mirror/megvii-research+basecls/repo rev-parse HEAD)
"""
import argparse
import json
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import megengine as mge  # noqa: E402
import numpy as np  # noqa: E402
import basecls.models  # noqa: E402,F401  (fills basecls's model registry)
from basecls.utils import registers  # noqa: E402
from basecls.zoo.utils import purify_weight  # noqa: E402

from basebn.utils.fs import sha256_of  # noqa: E402
from experiments.parity.weights_parity import random_state  # noqa: E402

NAME, NUM_CLASSES, SIZE, BATCH, WEIGHT_SEED, INPUT_SEED = "mbnetv1_x025", 10, 64, 2, 7, 8
OUT = os.path.join(ROOT, "tests", "fixtures", "basecls_published")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commit", required=True, help="basecls commit the source on PYTHONPATH was exported from")
    args = parser.parse_args()
    model = registers.models.get(NAME)(head=dict(w_out=NUM_CLASSES))
    keys = [[k, list(np.shape(v)), str(np.asarray(v).dtype)] for k, v in model.state_dict().items()]
    model.load_state_dict(random_state(keys, WEIGHT_SEED))
    path = os.path.join(OUT, "mbnet", NAME, f"{NAME}.pkl")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        dumped = os.path.join(tmp, "dumped_model.pkl")
        mge.save({"state_dict": model.state_dict()}, dumped)  # as basecls's CheckpointHook.after_train
        purify_weight(dumped, path)  # basecls's zoo file: the bare state dict
    model.eval()
    rgb = np.random.default_rng(INPUT_SEED).uniform(-2, 2, size=(BATCH, 3, SIZE, SIZE)).astype(np.float32)
    logits = model(mge.tensor(np.ascontiguousarray(rgb[:, ::-1]))).numpy()  # basecls sees the BGR image
    with open(os.path.join(OUT, f"{NAME}.json"), "w") as f:
        json.dump(dict(name=NAME, num_classes=NUM_CLASSES, basecls_commit=args.commit, input_seed=INPUT_SEED,
                       input="numpy default_rng(input_seed).uniform(-2, 2, (batch, 3, size, size)) float32: the RGB "
                             "image; basecls computed on its channels reversed (BGR)",
                       batch=BATCH, size=SIZE, weight_seed=WEIGHT_SEED, sha256=sha256_of(path),
                       logits=logits.tolist()), f, indent=1)
    print(f"wrote {path} ({os.path.getsize(path)} bytes) and {NAME}.json")


if __name__ == "__main__":
    main()
