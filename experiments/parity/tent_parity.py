"""TENT parity: TENT's own tent.py (PyTorch) against basebn's ``--adapt tent`` on the same ResNet-20, weights and batches.

    # tent.py, unmodified, into a git-ignored scratch folder (MIT licence; fetched, not committed), e.g.
    mkdir -p experiments/parity/.scratch && curl -sL https://raw.githubusercontent.com/DequanWang/tent/master/tent.py \
        -o experiments/parity/.scratch/tent.py            # or: git -C <a clone of DequanWang/tent> show HEAD:tent.py > ...
    .venv-corrupt/bin/python experiments/fashion_mnist_c.py --severities 5      # the corrupted test sets
    .venv-bench/bin/python experiments/parity/tent_parity.py --tent-py experiments/parity/.scratch/tent.py \
        [--zoo fmnist_r20] [--corruptions gaussian_noise contrast] [--severity 5]

Per corruption: (1) experiments/parity/tent_parity_basebn.py, in basebn's venv (``--basebn-python``, default .venv/bin/python),
builds the zoo entry's test loader on OUT/<corruption>/<severity> (batch 200, the stored order, the entry's test
preprocessing) and saves those input batches and basebn.engine.adapt.tent's logits; (2) ``python -m basebn.test
zoo:NAME data.root=... batch_size=200 --adapt tent --json`` gives the CLI's top-1; (3) here, a PyTorch transcription
of basebn's ResNet-20 (models/resnet.py: small stem, BasicBlocks, torchvision names) loads the zoo .npz (read with
numpy, sha256 checked against zoo.json) and is adapted by tent.py exactly as TENT's cifar10c.py does (configure_model,
collect_params, Adam(lr 1e-3, betas (0.9, 0.999), wd 0), Tent(steps=1, episodic=False)) on the same batches.
Prints the top-1 of each and the per-image agreement. Torch venv (CPython 3.11, no MegEngine needed):
    python3.11 -m venv .venv-bench
    PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS= .venv-bench/bin/pip install torch==2.13.0 torchvision==0.28.0 "numpy<2"
"""
import argparse
import hashlib
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


class BasicBlock(nn.Module):
    """basebn.models.resnet.BasicBlock in PyTorch: conv-BN-ReLU, conv-BN, (1x1 conv-BN shortcut), add, ReLU."""

    def __init__(self, cin, width, stride, eps):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, width, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width, eps=eps)
        self.conv2 = nn.Conv2d(width, width, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width, eps=eps)
        self.downsample = None
        if stride != 1 or cin != width:
            self.downsample = nn.Sequential(nn.Conv2d(cin, width, 1, stride, bias=False), nn.BatchNorm2d(width, eps=eps))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + identity)


class ResNet20(nn.Module):
    """basebn.models.resnet.resnet20 (stem "small": one 3x3 conv of stride ``stem_stride``), same module names."""

    def __init__(self, in_channels=1, num_classes=10, base_width=16, stem_stride=1, eps=1e-5):
        super().__init__()
        widths = [base_width, base_width * 2, base_width * 4]
        self.conv1 = nn.Conv2d(in_channels, widths[0], 3, stem_stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0], eps=eps)
        cin = widths[0]
        for i, width in enumerate(widths):
            blocks = []
            for j in range(3):
                blocks.append(BasicBlock(cin, width, 2 if (i > 0 and j == 0) else 1, eps))
                cin = width
            setattr(self, f"layer{i + 1}", nn.Sequential(*blocks))
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(x.mean(dim=(2, 3)))


def sha256_of(path):
    """Hex sha256 of a file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load_basebn_weights(model, path, sha256):
    """The ``model/`` arrays of a basebn weights .npz (numpy, no pickle) into ``model``; every tensor must match."""
    if sha256_of(path) != sha256:
        raise SystemExit(f"error: {path} does not have the sha256 zoo.json lists ({sha256})")
    with np.load(path, allow_pickle=False) as z:
        arrays = {k[len("model/"):]: z[k] for k in z.files if k.startswith("model/")}
    state = model.state_dict()
    wanted = {k for k in state if not k.endswith("num_batches_tracked")}
    if set(arrays) != wanted:
        raise SystemExit(f"error: weights and transcription differ: only in the file {sorted(set(arrays) - wanted)}, "
                         f"only in the model {sorted(wanted - set(arrays))}")
    for k, v in arrays.items():
        if tuple(state[k].shape) != v.shape:
            raise SystemExit(f"error: {k}: file shape {v.shape}, model {tuple(state[k].shape)}")
        state[k] = torch.from_numpy(np.array(v, dtype=np.float32))
    model.load_state_dict(state)
    return model


def import_tent(path):
    """TENT's tent.py as a module, imported from ``path`` as it is; returns (module, its sha256)."""
    if not os.path.isfile(path):
        raise SystemExit(f"error: {path} not found; fetch TENT's tent.py first (see this script's doc: "
                         f"curl -sL https://raw.githubusercontent.com/DequanWang/tent/master/tent.py -o {path})")
    spec = importlib.util.spec_from_file_location("tent", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, sha256_of(path)


def run_tent_py(tent, dump):
    """Logits of TENT's tent.py on the dumped batches, as TENT's cifar10c.py sets it up (setup_tent)."""
    model = ResNet20(in_channels=dump["images"].shape[1], base_width=int(dump["base_width"]),
                     stem_stride=int(dump["stem_stride"]), eps=float(dump["bn_eps"][0]))
    load_basebn_weights(model, str(dump["weights_file"]), str(dump["weights_sha256"]))
    model.eval()
    images, bs = torch.from_numpy(dump["images"]), int(dump["batch_size"])
    with torch.no_grad():
        source = torch.cat([model(images[i:i + bs]) for i in range(0, len(images), bs)]).numpy()
    model = tent.configure_model(model)
    params, _ = tent.collect_params(model)
    optimizer = torch.optim.Adam(params, lr=1e-3, betas=(0.9, 0.999), weight_decay=0.0)
    tented = tent.Tent(model, optimizer, steps=1, episodic=False)
    tent.check_model(model)
    adapted = torch.cat([tented(images[i:i + bs]).detach() for i in range(0, len(images), bs)]).numpy()
    return source, adapted


def top1(logits, labels):
    """Top-1 accuracy in percent."""
    return 100.0 * float((logits.argmax(1) == labels).mean())


def basebn_cli_top1(python, zoo, root, batch_size):
    """Top-1 of ``python -m basebn.test zoo:NAME data.root=ROOT batch_size=B --adapt tent --json``."""
    cmd = [python, "-m", "basebn.test", f"zoo:{zoo}", f"data.root={root}", f"batch_size={batch_size}",
           "--adapt", "tent", "--json"]
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"error: {' '.join(cmd)} failed:\n{res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])["top1"], " ".join(cmd[1:])


def parse_args(argv):
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tent-py", default=os.path.join(HERE, ".scratch", "tent.py"), help="TENT's tent.py, unmodified")
    p.add_argument("--zoo", default="fmnist_r20", help="zoo entry (a ResNet-20 with the small stem)")
    p.add_argument("--root", default=os.path.join(REPO, "runs", "fashion_mnist_c"),
                   help="experiments/fashion_mnist_c.py's output folder")
    p.add_argument("--corruptions", nargs="+", default=["gaussian_noise", "contrast"])
    p.add_argument("--severity", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=200)
    p.add_argument("--basebn-python", default=os.path.join(REPO, ".venv", "bin", "python"))
    p.add_argument("--scratch", default=os.path.join(HERE, ".scratch"))
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    return p.parse_args(argv)


def main(argv=None):
    """Print the parity table; exit 1 when a corruption's top-1 differs by more than 0.1 point."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    tent, tent_sha = import_tent(args.tent_py)
    os.makedirs(args.scratch, exist_ok=True)
    print(f"TENT tent.py: {args.tent_py} (sha256 {tent_sha[:16]}...), torch {torch.__version__}; zoo:{args.zoo}, "
          f"severity {args.severity}, batch {args.batch_size}, Adam lr 1e-3, 1 step, not episodic\n")
    rows, worst = [], 0.0
    for name in args.corruptions:
        root = os.path.join(args.root, name, str(args.severity))
        if not os.path.isdir(root):
            raise SystemExit(f"error: {root} missing; run experiments/fashion_mnist_c.py first")
        dump_path = os.path.join(args.scratch, f"{args.zoo}_{name}_{args.severity}.npz")
        subprocess.run([args.basebn_python, os.path.join(HERE, "tent_parity_basebn.py"), f"zoo:{args.zoo}", root,
                        dump_path, "--batch-size", str(args.batch_size)], cwd=REPO, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        cli, cmd = basebn_cli_top1(args.basebn_python, args.zoo, root, args.batch_size)
        with np.load(dump_path, allow_pickle=False) as z:
            dump = {k: z[k] for k in z.files}
        source, adapted = run_tent_py(tent, dump)
        labels = dump["labels"]
        agree = 100.0 * float((adapted.argmax(1) == dump["tent_logits"].argmax(1)).mean())
        max_diff = float(np.abs(adapted - dump["tent_logits"]).max())
        ref = top1(adapted, labels)
        worst = max(worst, abs(cli - ref))
        rows.append(f"| {name} | {top1(dump['source_logits'], labels):.2f} / {top1(source, labels):.2f} | {cli:.2f} | "
                    f"{top1(dump['tent_logits'], labels):.2f} | {ref:.2f} | {cli - ref:+.2f} | {agree:.2f} | "
                    f"{max_diff:.2e} |")
        print(f"{name}: {cmd} -> {cli:.2f}; tent.py {ref:.2f}", flush=True)
    print(f"\n| corruption (sev {args.severity}) | source top-1 basebn / torch | basebn --adapt tent | "
          f"basebn.engine.adapt.tent | TENT tent.py | CLI - tent.py | same prediction (%) | max abs logit diff |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    print("\n".join(rows))
    ok = worst <= 0.1
    print(f"\nlargest top-1 difference {worst:.2f} point(s): {'within' if ok else 'OUTSIDE'} the 0.1-point goal")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
