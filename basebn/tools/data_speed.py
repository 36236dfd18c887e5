"""python -m basebn.tools.data_speed CONFIG [KEY=VALUE ...] [--batches N] [--json]

Iterates the training loader of an experiment (same dataset, transforms, workers as
``basebn.train``; no model) and prints images/s. The first batch (worker start-up, first decodes)
is not timed. With ``--json`` the last line is
``{"images_per_s": ..., "workers": ..., "batch_size": ..., "batches": ..., "seconds": ...}``.
Try several ``data.num_workers=N`` to find the count that keeps your GPU fed.
"""
import argparse
import json
import sys
import time

from ..cli import cli_main
from ..config import load_config
from ..engine.build import build_data
from ..utils.cli_args import MAX_ITERS, OneLineArgumentParser, bounded_int

__all__ = ["measure", "main"]


def measure(loader, batches: int):
    """(images, seconds) over ``batches`` batches of ``loader`` after one untimed batch."""
    images, epoch, start, timed = 0, 0, None, 0
    while timed < batches:
        loader.set_epoch(epoch)
        for x, _ in loader:
            if start is None:  # the untimed first batch
                start = time.perf_counter()
                continue
            images += len(x)
            timed += 1
            if timed >= batches:
                break
        epoch += 1
    return images, time.perf_counter() - start


@cli_main
def main(argv=None):
    """Entry point; returns the exit code."""
    p = OneLineArgumentParser(prog="python -m basebn.tools.data_speed", description=__doc__.split("\n\n")[1],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", metavar="CONFIG", help="experiment file (.py)")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, as for basebn.train")
    p.add_argument("--batches", type=bounded_int(1, MAX_ITERS), default=50, help="batches to time (default 50)")
    p.add_argument("--json", action="store_true", help="end with one JSON line")
    args = p.parse_intermixed_args(argv)
    cfg = load_config(args.config, args.overrides)
    _, loader = build_data(cfg, train=True)
    try:
        images, seconds = measure(loader, args.batches)
    finally:
        loader.close()
    rate = images / max(seconds, 1e-9)
    print(f"{rate:.1f} images/s ({images} images in {seconds:.2f} s, batch_size {loader.batch_size}, "
          f"data.num_workers {loader.num_workers})")
    if args.json:
        print(json.dumps({"images_per_s": round(rate, 2), "workers": loader.num_workers,
                          "batch_size": loader.batch_size, "batches": args.batches,
                          "seconds": float(f"{seconds:.6g}")}))  # 6 significant digits: runs can be ms short
    return 0


if __name__ == "__main__":
    sys.exit(main())
