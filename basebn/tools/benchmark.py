"""python -m basebn.tools.benchmark NAME [--batch B] [--input S] [--train] [--iters N] [--warmup W]

Throughput of model NAME (any basebn.models name) on random images, like basecls's zoo/benchmark.py:
eval mode forward passes, or with --train full SGD steps (forward, cross-entropy, backward, update).
The first W iterations are not timed; every timed iteration ends with a full device sync. Prints
images/s, ms per iteration and the peak memory: the device's peak allocation on a GPU, the process's
peak resident set (all of Python and MegEngine included) on CPU.
"""
import argparse
import resource
import sys
import time

import megengine as mge
import megengine.functional as F
import megengine.optimizer as optim
import numpy as np
from megengine.autodiff import GradManager

from ..cli import cli_main
from ..config import ConfigError
from ..engine.build import check_input_size
from ..models import build_model, list_models, model_info
from ..utils.cli_args import MAX_BATCH, MAX_IMAGE_SIZE, MAX_ITERS, OneLineArgumentParser, bounded_int
from .summary import unknown_model_message

__all__ = ["measure", "peak_memory_mib", "main"]


def _step(model, train):
    """One iteration's function: eval forward, or a train step (forward, loss, backward, SGD update)."""
    if not train:
        model.eval()
        return lambda x, y: model(x)
    model.train()
    gm = GradManager().attach(model.parameters())
    opt = optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def train_step(x, y):
        with gm:
            loss = F.nn.cross_entropy(model(x), y)
            gm.backward(loss)
        opt.step().clear_grad()
        return loss

    return train_step


def measure(model, batch, size, train, iters, warmup, num_classes=1000):
    """Seconds per timed iteration of `model` on a random (batch, 3, size, size) input."""
    rng = np.random.default_rng(0)
    x = mge.tensor(rng.normal(size=(batch, 3, size, size)).astype(np.float32))
    y = mge.tensor(rng.integers(0, num_classes, size=batch).astype(np.int32))
    step = _step(model, train)
    for _ in range(warmup):
        step(x, y)
    mge._full_sync()
    start = time.perf_counter()
    for _ in range(iters):
        step(x, y)
        mge._full_sync()
    return (time.perf_counter() - start) / iters


def peak_memory_mib():
    """(MiB, what was measured): the GPU's peak allocation when MegEngine runs on one, else peak RSS."""
    if mge.is_cuda_available():
        return mge.device.get_max_allocated_memory() / 2 ** 20, "GPU peak allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "process peak RSS"


def build_parser():
    """The argument parser."""
    p = OneLineArgumentParser(prog="python -m basebn.tools.benchmark", description=__doc__.split("\n\n")[1],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", help="model name (python -m basebn.tools.summary --list)")
    p.add_argument("--batch", type=bounded_int(1, MAX_BATCH), default=32, help="images per iteration (default 32)")
    p.add_argument("--input", type=bounded_int(8, MAX_IMAGE_SIZE), default=None,
                   help="image side in px (default: the model's test size)")
    p.add_argument("--train", action="store_true", help="time training steps instead of eval forward passes")
    p.add_argument("--iters", type=bounded_int(1, MAX_ITERS), default=20, help="timed iterations (default 20)")
    p.add_argument("--warmup", type=bounded_int(0, MAX_ITERS), default=3, help="untimed iterations first (default 3)")
    return p


@cli_main
def main(argv=None):
    """Entry point; returns the exit code."""
    args = build_parser().parse_args(argv)
    if args.name not in list_models():
        raise ConfigError(unknown_model_message(args.name))
    size = args.input or model_info(args.name)["input_size"]
    model = build_model(args.name)
    check_input_size(model, (3, size, size), f"{args.name} (--input {size})")
    seconds = measure(model, args.batch, size, args.train, args.iters, args.warmup)
    memory, what = peak_memory_mib()
    mode = "train" if args.train else "eval"
    print(f"model {args.name}  mode {mode}  batch {args.batch}  input {size}  iters {args.iters}")
    print(f"throughput: {args.batch / seconds:.1f} images/s ({seconds * 1000:.1f} ms/iter)")
    print(f"peak memory: {memory:.1f} MiB ({what})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
