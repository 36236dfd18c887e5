"""Weights from basecls and timm give basebn the originals' logits: the parity table, and the test fixtures.

For each case, basecls's / timm's own code (run in a subprocess: basecls with .venv's python and its
source on PYTHONPATH, timm with the PyTorch venv's) lists its state-dict keys; random weights (random BN
running stats too) are drawn with numpy from a seed in that key order (:func:`random_state`) and written
as the library writes them (``mge.save`` pickle / ``.safetensors``); the original model loads them and
computes eval-mode logits on a seeded random batch (64 px; vgg11_bn 224); basebn loads the same file
through ``basecls:`` / ``timm:`` and the max abs difference is printed. With ``--fixtures DIR`` each case's
keys, seeds and reference logits go to DIR/<library>_<name>.json (tests/models/test_weights_import.py
replays them). Takes ~10 minutes on 2 busy cores:

    git -C /work/.mirror/megvii-research+basecls/repo archive HEAD | tar -x -C /tmp/basecls_src
    .venv/bin/python experiments/parity/weights_parity.py --fixtures tests/fixtures/weights
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import megengine as mge
import numpy as np
from safetensors.numpy import save_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from basebn.checkpoint import CheckpointError  # noqa: E402
from basebn.models import build_model, load_weights  # noqa: E402

BASECLS_PYTHON = os.path.join(ROOT, ".venv", "bin", "python")
BASECLS_SRC = "/tmp/basecls_src"
TORCH_PYTHON = "/tmp/convbench/torchvenv/bin/python"
NUM_CLASSES, INPUT_SIZE, BATCH = 10, 64, 2
FOREIGN_BN_EPS = 1e-5
WEIGHT_SEED, INPUT_SEED = 1, 2

# (basebn name, the library's name): one or more per family the library has
BASECLS_CASES = [(n, n) for n in (
    "resnet18", "resnet18d", "se_resnet18", "resnext50_32x4d", "wide_resnet50_2", "regnetx_002", "regnety_002",
    "mbnetv1_x025", "mbnetv2_x035", "mbnetv3_small_x075", "mbnetv3_large_x075", "effnet_b0", "effnet_b0_lite",
    "effnetv2_b0", "snetv2_x050", "snetv2p_x075", "repvgg_a0", "vgg11_bn", "hrnet_w18_small_v1")]
TIMM_CASES = [("resnet18", "resnet18"), ("resnet18d", "resnet18d"), ("se_resnet18", "seresnet18"),
              ("resnext50_32x4d", "resnext50_32x4d"), ("regnetx_002", "regnetx_002"),
              ("regnety_002", "regnety_002"), ("mbnetv2_x035", "mobilenetv2_035"), ("effnet_b0", "efficientnet_b0"),
              ("effnet_b0_lite", "efficientnet_lite0"), ("repvgg_a0", "repvgg_a0"),
              ("hrnet_w18_small_v1", "hrnet_w18_small"),
              ("vgg11_bn", "vgg11_bn")]

# (library, basebn name) -> basecls head options, basebn kwargs, input size. vgg11_bn at 224 px: basecls's
# adaptive 7x7 pool crashes MegEngine (divide error) on a 2x2 map, timm's equals basecls's only up to 224;
# basecls's with 64-wide fcs (0.5 GB less random weights; timm's fcs are 4096 wide, fixed)
CASE_OPTIONS = {("basecls", "vgg11_bn"): (dict(width=64), dict(head_width=64), 224),
                ("timm", "vgg11_bn"): ({}, {}, 224)}
# the reference side: `keys NAME HEAD` prints [[key, shape, dtype], ...]; `logits NAME HEAD FILE` the logits
_BASECLS_REF = """
import json, sys, numpy as np, megengine as mge
import basecls.models
from basecls.utils import registers
mode, name, head = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
model = registers.models.get(name)(head=dict(w_out=%(nc)d, **head))
if mode == "keys":
    print(json.dumps([[k, list(np.shape(v)), str(np.asarray(v).dtype)] for k, v in model.state_dict().items()]))
else:
    model.load_state_dict(mge.load(sys.argv[4])["model"])
    model.eval()
    s = int(sys.argv[5])
    x = np.random.default_rng(%(seed)d).normal(size=(%(b)d, 3, s, s)).astype(np.float32)
    print(json.dumps(model(mge.tensor(x)).numpy().tolist()))
"""
_TIMM_REF = """
import json, sys, numpy as np, torch, timm
from safetensors.torch import load_file
mode, name = sys.argv[1], sys.argv[2]
model = timm.create_model(name, num_classes=%(nc)d)  # argv[3]: basecls's head options, unused
if mode == "keys":
    print(json.dumps([[k, list(v.shape), str(v.dtype).replace("torch.", "")] for k, v in model.state_dict().items()]))
else:
    model.load_state_dict(load_file(sys.argv[4]), strict=True)
    model.eval()
    s = int(sys.argv[5])
    x = np.random.default_rng(%(seed)d).normal(size=(%(b)d, 3, s, s)).astype(np.float32)
    with torch.no_grad():
        print(json.dumps(model(torch.from_numpy(x)).double().numpy().tolist()))
"""
_PARAMS = dict(nc=NUM_CLASSES, seed=INPUT_SEED, b=BATCH)


# RepVGG sums three BN branches per block: with gammas U(0.5, 1.5) its random logits reach ~1e3 (where a
# float32 ulp is ~1e-4); smaller gammas keep them O(1), so the 1e-4 bound is absolute for every case
GAMMA = {"repvgg_a0": (0.3, 0.8)}


def random_state(keys, seed, gamma=(0.5, 1.5)):
    """Random weights for `keys` ([[key, shape, dtype], ...]) drawn in that order: BN gamma U(*gamma),
    beta and biases N(0, 0.2), running mean N(0, 0.2), running var U(0.5, 2), other weights
    N(0, 1/fan_in) (fan_in: all but the first axis), integer counters 0. Only the order and sizes decide
    the numbers, so PyTorch- and MegEngine-shaped lists of the same model give the same values."""
    rng = np.random.default_rng(seed)
    state = {}
    for key, shape, dtype in keys:
        shape, leaf = tuple(shape), key.rsplit(".", 1)[-1]
        n = int(np.prod(shape))
        if not dtype.startswith("float"):
            state[key] = np.zeros(shape, dtype=dtype)
            continue
        vector = sum(d > 1 for d in shape) <= 1
        if leaf == "running_var":
            a = rng.uniform(0.5, 2.0, n)
        elif leaf in ("running_mean", "bias"):
            a = rng.normal(0.0, 0.2, n)
        elif vector:  # a norm's gamma
            a = rng.uniform(gamma[0], gamma[1], n)
        else:
            fan_in = n // shape[0]
            a = rng.normal(0.0, 1.0 / np.sqrt(fan_in), n)
        state[key] = a.astype(np.float32).reshape(shape)
    return state


def input_batch(seed=INPUT_SEED, batch=BATCH, size=INPUT_SIZE):
    """The seeded random input both sides compute."""
    return np.random.default_rng(seed).normal(size=(batch, 3, size, size)).astype(np.float32)


def _reference(library, *args):
    if library == "basecls":
        cmd, env = [BASECLS_PYTHON, "-c", _BASECLS_REF % _PARAMS], {**os.environ, "PYTHONPATH": BASECLS_SRC}
    else:
        cmd, env = [TORCH_PYTHON, "-c", _TIMM_REF % _PARAMS], {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run(cmd + list(args), env=env, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"{library} reference failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def write_weights(library, state, path):
    """Write `state` as the library does: basecls's checkpoint dict via mge.save, or a .safetensors file."""
    if library == "basecls":  # MegEngine's own mge.save, as basecls's checkpoint hook calls it
        mge.save({"model": state, "progress": {"epoch": 1, "iter": 0}}, path)
    else:
        save_file(state, path)


def basebn_input(library, size=INPUT_SIZE):
    """The images basebn's model gets for the library's logits on input_batch(size): basecls's models take the
    batch as BGR, and basebn turns basecls's weights to RGB input, so it gets the channels reversed."""
    images = input_batch(size=size)
    return np.ascontiguousarray(images[:, ::-1]) if library == "basecls" else images


def basebn_logits(library, name, path, size=INPUT_SIZE, **kwargs):
    """basebn's eval-mode logits after loading `path` through `library:` (basecls: on the channel-reversed
    input, as basebn turns basecls's BGR weights to RGB). basecls's models and timm's
    PyTorch ports use BN eps 1e-5 (basebn's default for every family; passed here explicitly all the same)."""
    model = build_model(name, num_classes=NUM_CLASSES, bn_eps=FOREIGN_BN_EPS, **kwargs)
    load_weights(model, f"{library}:{path}")
    model.eval()
    return model(mge.tensor(basebn_input(library, size))).numpy()


def run_case(library, name, ref_name, tmp, fixtures=None):
    """-> max abs difference of basebn's logits and the library's (or the error basebn raised)."""
    head, kwargs, size = CASE_OPTIONS.get((library, name), ({}, {}, INPUT_SIZE))
    keys = _reference(library, "keys", ref_name, json.dumps(head))
    path = os.path.join(tmp, f"{library}_{ref_name}.{'pkl' if library == 'basecls' else 'safetensors'}")
    gamma = GAMMA.get(name, (0.5, 1.5))
    write_weights(library, random_state(keys, WEIGHT_SEED, gamma), path)
    ref = np.asarray(_reference(library, "logits", ref_name, json.dumps(head), path, str(size)), dtype=np.float32)
    if fixtures:
        with open(os.path.join(fixtures, f"{library}_{name}.json"), "w") as f:
            json.dump(dict(library=library, name=name, reference_name=ref_name, num_classes=NUM_CLASSES,
                           basebn_kwargs=kwargs, input_size=size, batch=BATCH, weight_seed=WEIGHT_SEED,
                           input_seed=INPUT_SEED, gamma=list(gamma), keys=keys, logits=ref.tolist()), f, separators=(",", ":"))
    try:
        logits = basebn_logits(library, name, path, size, **kwargs)
        return float(np.abs(logits - ref).max()), float(np.abs(ref).max())
    except CheckpointError as exc:  # a refused family: its message goes in the table
        return f"refused: {str(exc).splitlines()[0][:110]}", float(np.abs(ref).max())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixtures", help="write each case's fixture JSON into this directory")
    parser.add_argument("--only", nargs="*", help="basebn names to run (default: all cases)")
    parser.add_argument("--library", choices=("basecls", "timm"), help="run only this library's cases")
    args = parser.parse_args()
    if args.fixtures:
        os.makedirs(args.fixtures, exist_ok=True)
    print("| library | basebn name | reference | max abs diff | max abs logit |\n|---|---|---|---|---|", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for library, cases in (("basecls", BASECLS_CASES), ("timm", TIMM_CASES)):
            for name, ref_name in cases:
                if (args.only and name not in args.only) or (args.library and library != args.library):
                    continue
                diff, scale = run_case(library, name, ref_name, tmp, args.fixtures)
                shown = f"{diff:.2e}" if isinstance(diff, float) else diff
                print(f"| {library} | {name} | {ref_name} | {shown} | {scale:.3g} |", flush=True)
                for f in os.listdir(tmp):
                    os.remove(os.path.join(tmp, f))


if __name__ == "__main__":
    main()
