"""ClsTrainer step time vs a bare MegEngine training loop, same model, same batch, side by side.

    .venv/bin/python benchmarks/bench_trainer_overhead.py [--iters 20] [--rounds 3]

Both loops run the same ResNet-20 (width 16) on the same fixed batch (64 x 1 x 28 x 28); rounds
alternate between them to cancel machine drift. The trainer runs with its default per-iteration hooks
(lr schedule, logger). Prints median ms/iteration and the ratio trainer / bare; ``--results FILE``
(results/trainer_overhead.json) appends them.
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import megengine as mge  # noqa: E402
import megengine.functional as F  # noqa: E402
from megengine.autodiff import GradManager  # noqa: E402

from basebn.config import BaseConfig  # noqa: E402
from basebn.engine.build import build_trainer  # noqa: E402
from basebn.engine.hooks import LoggerHook, LRScheduleHook  # noqa: E402
from basebn.engine.optimizer import build_optimizer  # noqa: E402
from basebn.models import build_model  # noqa: E402
from results_file import add_results_argument, default_threads, save_run  # noqa: E402


class FixedBatches:
    """A loader that yields the same batch `n` times per epoch (no data cost in either loop)."""

    def __init__(self, images, labels, n):
        self.images, self.labels, self.n = images, labels, n

    def set_epoch(self, epoch):
        pass

    def __len__(self):
        return self.n

    def __iter__(self):
        return iter([(self.images, self.labels)] * self.n)


def make(cfg):
    mge.random.seed(0)
    model = build_model("resnet20", num_classes=10, in_channels=1, base_width=16)
    opt = build_optimizer(model, cfg.solver, 0.05)
    gm = GradManager().attach(model.parameters())
    return model, opt, gm


def bare_loop(cfg, images, labels, iters):
    model, opt, gm = make(cfg)
    x, y = mge.tensor(images), mge.tensor(labels)
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        with gm:
            loss = F.nn.cross_entropy(model(x), y)
            gm.backward(loss)
        opt.step()
        opt.clear_grad()
        loss.item()
        times.append(time.perf_counter() - t)
    return times


def trainer_loop(cfg, images, labels, iters):
    model, opt, _ = make(cfg)  # build_trainer attaches its own GradManager
    loader = FixedBatches(images, labels, iters)
    # time the whole iteration including hooks: the first hook starts the clock, the last stops it
    start, wall = [0.0], []

    class Wall(LRScheduleHook):
        def before_iter(self):
            start[0] = time.perf_counter()
            super().before_iter()

    class WallEnd(LoggerHook):
        def after_iter(self):
            super().after_iter()
            wall.append(time.perf_counter() - start[0])

    trainer = build_trainer(cfg, model, loader, opt, hooks=[Wall(0.05, cfg.solver), WallEnd(10 ** 9)])
    trainer.train(start_info=[1, 1], max_info=[1, iters])
    return wall


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    add_results_argument(p)
    args = p.parse_args()
    cfg = BaseConfig()
    cfg.solver.warmup_epochs = 0
    rng = np.random.default_rng(0)
    images = rng.standard_normal((64, 1, 28, 28)).astype(np.float32)
    labels = rng.integers(0, 10, 64).astype(np.int32)
    bare, ours = [], []
    for r in range(args.rounds):
        bare += bare_loop(cfg, images, labels, args.iters)[2:]  # drop warm-up iterations
        ours += trainer_loop(cfg, images, labels, args.iters)[2:]
    b, t = np.median(bare) * 1e3, np.median(ours) * 1e3
    print(f"bare MegEngine loop : {b:8.1f} ms/iter")
    print(f"ClsTrainer + hooks  : {t:8.1f} ms/iter")
    print(f"ratio trainer/bare  : {t / b:8.3f}")
    figures = {"ms": {"trainer_and_hooks": round(t, 1), "bare_loop": round(b, 1)}, "trainer_over_bare": round(t / b, 3)}
    save_run(args.results, "benchmarks/bench_trainer_overhead.py", "trainer", default_threads(), figures,
             "the trainer's and hooks' cost over a bare loop", conditions="ResNet-20 w16, batch 64")


if __name__ == "__main__":
    main()
