"""EMA update cost: basebn's vectorised ModelEMA vs a per-tensor loop vs one training step.

    .venv/bin/python benchmarks/bench_ema.py [--width 16] [--batch 64] [--size 16] [--rounds 3]

CIFAR-style ResNet-20 (basebn.models.resnet20, BN), 3 x size x size inputs, SGD with momentum,
update_period=1. Each round times, interleaved so that machine load hits all alike:

* training step: forward + backward + optimizer step (synchronised by reading the loss);
* EMA, per-tensor loop: ``e._reset(e * m + p * (1 - m))`` for each parameter and buffer (what a
  straightforward EMA does: three small ops per tensor);
* EMA, vectorised: ``ModelEMA.update`` (one concat, one fused expression on a flat buffer);
* EMA, vectorised + ``.module`` read: the same followed by the write-back into the module (one
  split) and, at the next update, the re-read of the module (one concat): what an EMA whose state is
  the module (eager refresh, timm's ModelEmaV3) pays per update. ModelEMA refreshes lazily, when
  ``.module`` is read (evaluation reads it once per epoch), as long as this costs over 1% of a step.

Every timing ends by reading a value back, so queued asynchronous work is included. Medians of
each round's median; the goal is EMA update <= 3% of a training step. ``--results FILE``
(results/ema.json) appends each update's share of a step.
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import megengine as mge  # noqa: E402
import megengine.functional as F  # noqa: E402
import megengine.optimizer as optim  # noqa: E402
from megengine.autodiff import GradManager  # noqa: E402

from basebn.engine.ema import ModelEMA, _named_tensors  # noqa: E402
from basebn.models import build_model  # noqa: E402
from results_file import add_results_argument, default_threads, save_run  # noqa: E402


def naive_update(ema_tensors, model_tensors, m):
    for e, p in zip(ema_tensors, model_tensors):
        e._reset(e * m + p.detach() * (1 - m))


def median_ms(fn, reps, warmup=2):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times) * 1e3)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--size", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8, help="timed training steps per round")
    ap.add_argument("--updates", type=int, default=40, help="timed EMA updates per round and method")
    add_results_argument(ap)
    args = ap.parse_args()

    rng = np.random.default_rng(0)
    model = build_model("resnet20", num_classes=10, in_channels=3, base_width=args.width)
    opt = optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    gm = GradManager().attach(model.parameters())
    x = mge.tensor(rng.standard_normal((args.batch, 3, args.size, args.size)).astype(np.float32))
    y = mge.tensor(rng.integers(0, 10, args.batch).astype(np.int32))
    model.train()

    def step():
        with gm:
            loss = F.nn.cross_entropy(model(x), y)
            gm.backward(loss)
        opt.step()
        opt.clear_grad()
        loss.item()

    ema = ModelEMA(model, 0.999)
    ema_read = ModelEMA(model, 0.999)
    naive_module = ModelEMA(model, 0.999).module
    naive_tensors = [t for _, t in _named_tensors(naive_module)]
    model_tensors = [t for _, t in _named_tensors(model)]

    def vectorised():
        ema.update(model)
        ema._flat[:1].numpy()  # wait for the result

    def vectorised_with_read():
        ema_read.update(model)
        mod = ema_read.module
        next(iter(mod.parameters())).numpy()
        naive_tensors[-1].numpy()

    def loop():
        naive_update(naive_tensors, model_tensors, 0.999)
        naive_tensors[-1].numpy()

    n_params = sum(int(np.prod(t.shape)) for t in model_tensors)
    rows = {"step": [], "loop": [], "vec": [], "vec_read": []}
    for _ in range(args.rounds):
        rows["step"].append(median_ms(step, args.steps))
        rows["loop"].append(median_ms(loop, args.updates))
        rows["vec"].append(median_ms(vectorised, args.updates))
        rows["vec_read"].append(median_ms(vectorised_with_read, args.updates))
    s, l, v, vr = (float(np.median(rows[k])) for k in ("step", "loop", "vec", "vec_read"))

    # the averages agree (same number of updates with the same momentum from the same start)
    ref = ModelEMA(model, 0.5)
    ref_loop_tensors = [t for _, t in _named_tensors(ModelEMA(model, 0.5).module)]
    for _ in range(3):
        step()
        ref.update(model)
        naive_update(ref_loop_tensors, model_tensors, 0.5)
    err = max(float(np.abs(a.numpy() - b.numpy()).max())
              for (_, a), b in zip(_named_tensors(ref.module), ref_loop_tensors))

    print(f"model: resnet20 width {args.width}, batch {args.batch}, 3x{args.size}x{args.size}, "
          f"{len(model_tensors)} tensors, {n_params} values; device {x.device}")
    print(f"{'':32s} {'ms':>9s} {'% of step':>10s}")
    print(f"{'training step':32s} {s:9.3f} {100.0:9.1f}%")
    print(f"{'EMA update, per-tensor loop':32s} {l:9.3f} {100 * l / s:9.2f}%")
    print(f"{'EMA update, vectorised':32s} {v:9.3f} {100 * v / s:9.2f}%   ({l / v:.1f}x faster than the loop)")
    print(f"{'EMA vectorised + .module read':32s} {vr:9.3f} {100 * vr / s:9.2f}%")
    print(f"max |vectorised - loop| after 3 updates: {err:.2e}")
    print(f"goal (vectorised <= 3% of a step): {'met' if v <= 0.03 * s else 'NOT met'}")
    print(f"eager refresh (update + .module read) {100 * vr / s:.2f}% of a step: "
          f"{'the lazy refresh is worth keeping (> 1%)' if vr > 0.01 * s else 'under 1%: the lazy refresh could go'}")
    figures = {"share_of_step": {"flat": round(v / s, 4), "per_tensor": round(l / s, 4),
                                 "flat_and_module_read": round(vr / s, 4)},
               "ms": {"step": round(s, 3), "flat": round(v, 3), "per_tensor": round(l, 3), "flat_and_module_read":
                      round(vr, 3)}, "max_abs_flat_minus_loop": float(f"{err:.2e}")}
    save_run(args.results, "benchmarks/bench_ema.py", "ema", default_threads(), figures,
             "the model EMA update's share of a training step",
             conditions=f"ResNet-20 width {args.width}, batch {args.batch} of 3x{args.size}x{args.size}, "
                        "update_period=1")


if __name__ == "__main__":
    main()
