"""EMA update cost: basebn's vectorised ModelEMA vs a per-tensor loop vs one training step.

    .venv/bin/python benchmarks/bench_ema.py

Quickstart model (ResNet-20 width 8, 1x16x16 inputs, batch 64), update_period=1. Prints medians and
the EMA update as a fraction of a training step (goal <= 3%).
"""
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import megengine as mge  # noqa: E402
import megengine.functional as F  # noqa: E402
import megengine.optimizer as optim  # noqa: E402
from megengine.autodiff import GradManager  # noqa: E402

from basebn.engine.ema import ModelEMA  # noqa: E402
from basebn.models import build_model  # noqa: E402


def naive_update(ema_model, model, m):
    src = dict(list(model.named_parameters()) + list(model.named_buffers()))
    for n, t in list(ema_model.named_parameters()) + list(ema_model.named_buffers()):
        t._reset(t * m + src[n].detach() * (1 - m))


def median_ms(fn, reps):
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times[2:]) * 1e3)


def main():
    model = build_model("resnet20", num_classes=10, in_channels=1, base_width=8)
    opt = optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    gm = GradManager().attach(model.parameters())
    x = mge.tensor(np.random.default_rng(0).standard_normal((64, 1, 16, 16)).astype(np.float32))
    y = mge.tensor(np.random.default_rng(1).integers(0, 10, 64).astype(np.int32))

    def step():
        with gm:
            loss = F.nn.cross_entropy(model(x), y)
            gm.backward(loss)
        opt.step()
        opt.clear_grad()
        loss.item()

    ema = ModelEMA(model, 0.999)
    naive = ModelEMA(model, 0.999).module

    def vectorised():
        ema.update(model)
        ema._flat.numpy()  # wait for the result

    def loop():
        naive_update(naive, model, 0.999)
        next(iter(naive.parameters())).numpy()

    n_tensors = len(list(model.parameters())) + len(list(model.buffers()))
    s, v, l = [], [], []
    for _ in range(3):  # interleave rounds so drift hits all three alike
        s.append(median_ms(step, 8))
        v.append(median_ms(vectorised, 30))
        l.append(median_ms(loop, 30))
    s, v, l = np.median(s), np.median(v), np.median(l)
    print(f"model tensors          : {n_tensors}")
    print(f"training step          : {s:8.2f} ms")
    print(f"EMA update, vectorised : {v:8.2f} ms  ({100 * v / s:.2f}% of a step)")
    print(f"EMA update, per tensor : {l:8.2f} ms  ({100 * l / s:.2f}% of a step, {l / v:.1f}x the vectorised)")


if __name__ == "__main__":
    main()
