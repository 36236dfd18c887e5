"""Efficient conv-BN in eval mode: peak memory and time of fine-tuning steps, and fused-inference speed.

Fine-tuning with BN in eval mode (running statistics; conv weights, BN affine and fc still get
gradients), CPU, one forward+backward step per measurement. Variants, side by side:

    plain             BatchNorm2d in eval mode
    efficient         the same after enable_efficient_conv_bn_eval (folded weight built each forward)
    frozen            FrozenBatchNorm2d (convert_frozen_batchnorm), no efficient pass
    frozen_efficient  FrozenBatchNorm2d + enable_efficient_conv_bn_eval

and `infer`: eval forward time of the plain model against fuse_conv_bn(model).

Memory: each variant in a fresh subprocess (`--variant X`). After a warm-up step at batch 1
(kernels, allocator and parameter gradients set up), the peak-RSS mark is reset (`echo 5 >
/proc/self/clear_refs`; without it, ru_maxrss-style VmHWM before/after) and one full-batch step is
run; reported, over the RSS just before the step: the RSS held at the end of the forward ("act":
the activations kept for backward), and the peak (VmHWM) up to the end of the forward ("fwd pk",
with forward temporaries) and of the backward ("step pk"). Parameter gradients are cleared (set to
None) before the step, as an optimizer does, so "step pk" includes them (the same for all
variants, printed below the table). Child processes run with MALLOC_MMAP_THRESHOLD_ fixed so that
freed buffers go back to the system and RSS follows live memory.
Time: one more subprocess builds all variants and runs their steps round-robin (a fair comparison
on a shared, noisy CPU), best of --repeat steps each after one warm-up step (the minimum: load
from other processes only ever adds time).

    python benchmarks/bench_conv_bn.py                      # stack, resnet18, resnet50
    python benchmarks/bench_conv_bn.py --models resnet18 --batch 8 --size 96

``--results FILE`` (results/conv_bn.json) appends the efficient / plain ratios (activation memory, step time) per
model and their min-max over the models, and fuse_conv_bn's inference speed-up per model.
"""
import argparse
import json
import os
import subprocess
import sys
import time

from results_file import add_results_argument, default_threads, save_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

VARIANTS = ("plain", "efficient", "frozen", "frozen_efficient")
DEFAULTS = {  # model: (batch, image size) -- seconds per step on a CPU core, not minutes
    "stack": (16, 64),  # the brief's reference point: ~370 MiB for forward+backward
    "resnet18": (8, 128),
    "resnet50": (4, 128),
}


# ---------------------------------------------------------------- child: one variant

def _status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def _reset_peak():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _build(name):
    import megengine.module as M
    import megengine.functional as F

    from basebn.layers.conv import Conv2d

    if name == "stack":  # 8 x (conv3x3 -> BN -> ReLU), 64 channels, then global pool + fc
        class Stack(M.Module):
            def __init__(self, layers=8, width=64, num_classes=10):
                super().__init__()
                self.convs = [Conv2d(3 if i == 0 else width, width, 3, padding=1, bias=False) for i in range(layers)]
                self.bns = [M.BatchNorm2d(width) for _ in range(layers)]
                self.fc = M.Linear(width, num_classes)

            def forward(self, x):
                for conv, bn in zip(self.convs, self.bns):
                    x = F.relu(bn(conv(x)))
                return self.fc(F.mean(x, axis=(2, 3)))

        return Stack()
    from basebn.models import build_model

    return build_model(name, num_classes=10, in_channels=3, norm="BN", stem="imagenet")


def _randomize_bn(model, seed=0):
    import numpy as np

    from basebn.layers.norm import is_bn2d

    rng = np.random.default_rng(seed)
    for m in model.modules():
        if is_bn2d(m):
            c = m.num_features
            m.load_state_dict({
                "weight": rng.uniform(0.5, 1.5, (1, c, 1, 1)).astype(np.float32),
                "bias": rng.normal(0, 0.1, (1, c, 1, 1)).astype(np.float32),
                "running_mean": rng.normal(0, 0.1, (1, c, 1, 1)).astype(np.float32),
                "running_var": rng.uniform(0.5, 2.0, (1, c, 1, 1)).astype(np.float32),
            })


def _prepare(args, variant):
    """(model, params, pairs) of `variant`, set up for fine-tuning with BNs in eval mode."""
    import megengine as mge

    from basebn.layers import convert_frozen_batchnorm, enable_efficient_conv_bn_eval
    from basebn.layers.norm import is_bn2d

    mge.random.seed(0)
    model = _build(args.model)
    _randomize_bn(model)
    if variant.startswith("frozen"):
        model = convert_frozen_batchnorm(model)
    model.train()
    for m in model.modules():  # fine-tuning with norm_eval: BNs use (and keep) their running statistics
        if is_bn2d(m):
            m.eval()
    pairs = []
    if variant.endswith("efficient"):
        pairs = enable_efficient_conv_bn_eval(model, example_input=_inputs(args)[2])
    return model, list(model.parameters()), pairs


def _inputs(args):
    import numpy as np

    import megengine as mge

    rng = np.random.default_rng(1)
    x_full = mge.tensor(rng.standard_normal((args.batch, 3, args.size, args.size)).astype(np.float32))
    x_one = mge.tensor(rng.standard_normal((1, 3, args.size, args.size)).astype(np.float32))
    return x_full, x_one, np.zeros((1, 3, args.size, args.size), np.float32)


def _step(model, params, gm, x, marks=None):
    import megengine as mge

    for p in params:
        p.grad = None
    with gm:
        loss = model(x).mean()
        if marks is not None:
            loss.numpy()  # sync: the forward has run
            marks.append((_status_kib("VmRSS"), _status_kib("VmHWM")))
        gm.backward(loss)
    value = float(loss.numpy())
    mge._full_sync()
    return value


def child_memory(args):
    import numpy as np

    import megengine as mge
    from megengine.autodiff import GradManager

    model, params, pairs = _prepare(args, args.variant)
    x_full, x_one, _ = _inputs(args)
    gm = GradManager().attach(params)
    _step(model, params, gm, x_one)  # warm-up at batch 1
    for p in params:
        p.grad = None
    mge._full_sync()
    reset = _reset_peak()
    base = _status_kib("VmRSS") if reset else _status_kib("VmHWM")
    marks = []
    loss = _step(model, params, gm, x_full, marks)
    step_peak = _status_kib("VmHWM")
    grad_bytes = sum(int(np.prod(p.shape)) * 4 for p in params if p.grad is not None)
    print(json.dumps({
        "model": args.model, "variant": args.variant, "pairs": len(pairs), "loss": loss,
        "act_mib": (marks[0][0] - base) / 1024, "fwd_mib": (marks[0][1] - base) / 1024,
        "step_mib": (step_peak - base) / 1024,
        "grads_mib": grad_bytes / 2 ** 20, "hwm_reset": reset,
    }))


def child_time(args):
    from megengine.autodiff import GradManager

    variants = [v for v in args.variants.split(",") if v in VARIANTS]
    x_full, _, _ = _inputs(args)
    runs = {}
    for v in variants:
        model, params, _ = _prepare(args, v)
        runs[v] = (model, params, GradManager().attach(params))
        _step(*runs[v], x_full)  # warm-up
    times = {v: [] for v in variants}
    for _ in range(args.repeat):
        for v in variants:
            t = time.perf_counter()
            _step(*runs[v], x_full)
            times[v].append(time.perf_counter() - t)
    print(json.dumps({v: 1e3 * min(t) for v, t in times.items()}))


def child_infer(args):
    import numpy as np

    from basebn.layers import fuse_conv_bn
    from basebn.layers.norm import is_bn2d

    model = _prepare(args, "plain")[0]
    model.eval()
    x_full, _, small = _inputs(args)
    fused = fuse_conv_bn(model, example_input=small)
    n_bn = sum(is_bn2d(m) for m in fused.modules())
    times = {"plain": [], "fused": []}
    outs = {name: m(x_full).numpy() for name, m in (("plain", model), ("fused", fused))}  # warm-up
    for _ in range(args.repeat):
        for name, m in (("plain", model), ("fused", fused)):  # interleaved: fair under shared cores
            t = time.perf_counter()
            m(x_full).numpy()
            times[name].append(time.perf_counter() - t)
    err = float(np.abs(outs["fused"] - outs["plain"]).max() / np.abs(outs["plain"]).max())
    print(json.dumps({"model": args.model, "variant": "infer", "bn_left": n_bn, "rel_err": err,
                      "plain_ms": 1e3 * min(times["plain"]), "fused_ms": 1e3 * min(times["fused"])}))


# ---------------------------------------------------------------- parent: all variants, one table

def run_child(model, variant, batch, size, repeat, variants=""):
    cmd = [sys.executable, os.path.abspath(__file__), "--variant", variant, "--models", model,
           "--batch", str(batch), "--size", str(size), "--repeat", str(repeat), "--variants", variants]
    # fixed mmap threshold: large buffers are mmap'd and given back on free, so RSS follows live
    # memory (glibc's default threshold grows after frees and keeps freed buffers in its heap)
    # (memory runs only: it makes every large allocation a system call, which would skew times)
    env = dict(os.environ)
    if variant in VARIANTS:
        env["MALLOC_MMAP_THRESHOLD_"] = "131072"
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"{variant} on {model} failed:\n{out.stderr[-3000:]}")
    return json.loads(lines[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="stack,resnet18,resnet50")
    ap.add_argument("--variants", default=",".join(VARIANTS + ("infer",)))
    ap.add_argument("--batch", type=int, default=None, help="default per model: " + str(DEFAULTS))
    ap.add_argument("--size", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--variant", default=None, help=argparse.SUPPRESS)  # child mode
    add_results_argument(ap)
    args = ap.parse_args(argv)
    if args.variant is not None:
        args.model = args.models
        return {"time": child_time, "infer": child_infer}.get(args.variant, child_memory)(args)
    figures = {}

    for model in args.models.split(","):
        batch = args.batch or DEFAULTS.get(model, (16, 64))[0]
        size = args.size or DEFAULTS.get(model, (16, 64))[1]
        print(f"\n== {model}: fine-tuning step (forward+backward), BN in eval mode, batch {batch}, "
              f"{size}x{size}, CPU; time: best of {args.repeat} steps")
        rows = {}
        variants = args.variants.split(",")
        for v in [v for v in variants if v in VARIANTS]:
            rows[v] = run_child(model, v, batch, size, args.repeat)
        if rows:
            times = run_child(model, "time", batch, size, args.repeat, ",".join(rows))
            for v in rows:
                rows[v]["ms"] = times[v]
            ref = rows.get("plain")
            print(f"{'variant':<17}{'pairs':>6}{'act MiB':>9}{'x plain':>8}{'fwd pk':>8}{'x plain':>8}"
                  f"{'step pk':>9}{'x plain':>8}{'ms':>8}{'x plain':>8}{'loss':>14}")
            for v, r in rows.items():
                def ratio(key):
                    return f"{r[key] / ref[key]:.2f}" if ref and ref[key] > 0 else "-"
                print(f"{v:<17}{r['pairs']:>6}{r['act_mib']:>9.1f}{ratio('act_mib'):>8}{r['fwd_mib']:>8.1f}"
                      f"{ratio('fwd_mib'):>8}{r['step_mib']:>9.1f}{ratio('step_mib'):>8}{r['ms']:>8.0f}"
                      f"{ratio('ms'):>8}{r['loss']:>14.7g}")
            any_row = next(iter(rows.values()))
            print(f"act: RSS held after the forward (activations kept for backward); fwd pk / step pk: "
                  f"peak RSS to the end of forward / backward; all over the RSS before the step. "
                  f"Parameter gradients ({any_row['grads_mib']:.1f} MiB) are in 'step pk'. "
                  f"Peak reset via clear_refs: {any_row['hwm_reset']}.")
            if "plain" in rows and "efficient" in rows and rows["plain"]["act_mib"] > 0 and rows["plain"]["ms"] > 0:
                figures.setdefault("efficient_over_plain_by_model", {})[model] = {
                    "activation_memory": round(rows["efficient"]["act_mib"] / rows["plain"]["act_mib"], 3),
                    "step_time": round(rows["efficient"]["ms"] / rows["plain"]["ms"], 3)}
        if "infer" in variants:
            r = run_child(model, "infer", batch, size, 2 * args.repeat + 1)
            print(f"inference (eval forward, batch {batch}): plain {r['plain_ms']:.0f} ms, fused "
                  f"{r['fused_ms']:.0f} ms, speed-up {r['plain_ms'] / r['fused_ms']:.2f}x; "
                  f"BN left {r['bn_left']}, max rel diff {r['rel_err']:.1e}")
            figures.setdefault("fuse_conv_bn_inference_speedup", {})[model] = round(r["plain_ms"] / r["fused_ms"], 3)
            figures["fuse_max_rel_diff"] = max(figures.get("fuse_max_rel_diff", 0.0), float(f"{r['rel_err']:.1e}"))
    by_model = figures.get("efficient_over_plain_by_model", {})
    if by_model:
        figures["efficient_over_plain"] = {key: {"min": min(m[key] for m in by_model.values()),
                                                 "max": max(m[key] for m in by_model.values())}
                                           for key in ("activation_memory", "step_time")}
    save_run(args.results, "benchmarks/bench_conv_bn.py", "conv-bn", default_threads(), figures,
             "efficient conv-BN (eval-mode fine-tuning) and fuse_conv_bn inference",
             conditions=f"time: best of {args.repeat} steps, variants round-robin", argv=argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
