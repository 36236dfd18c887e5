"""Peak activation memory of one CPU training step: basebn fused BN-activation vs unfused vs PyTorch eager.

    nice -n 5 .venv/bin/python benchmarks/bench_activation_memory.py [--models resnet20 resnet18 mbnetv2]
        [--repeats 3] [--warmup 2] [--batch-scale 1] [--malloc fixed|default]
        [--torch-python PY | --install-torch] [--json OUT] [--results results/activation_memory.json]

    e.g. nice -n 5 .venv/bin/python benchmarks/bench_activation_memory.py --torch-python .venv-bench/bin/python

Models, batches, inputs and the SGD (momentum 0.9, weight decay groups) are bench_train_step.py's (imported:
``MODELS``, ``MegEngineRunner``, the PyTorch model code of ``TORCH_WORKER``). Runners:
  fused    basebn's ``build_model`` as the trainer builds it (BN + activation layers fused, bn_act.py)
  unfused  the same, built with ``with_act`` replaced by ``lambda norm, act: norm`` in basebn.layers.bn_act and
           in every basebn module that imported it (as tests/layers/test_bn_act_resnet.py does): plain BN,
           then the activation / the residual add as separate MegEngine ops
  torch    bench_train_step.py's hand-written PyTorch equivalent, eager, in its own interpreter
Every measurement is a fresh process (runner x model x repeat), one thread everywhere (OMP / MKL / OpenBLAS /
BASEBN_NUM_THREADS = 1, MegEngine on ``cpu0``, ``torch.set_num_threads(1)``). In the process: build the model,
the optimizer and the batch, run ``--warmup`` training steps (forward, backward, SGD step, gradients freed:
``clear_grad()`` / ``zero_grad(set_to_none=True)`` after the update, so neither framework holds gradients between
steps), ``gc.collect()``, drain MegEngine's queue, then

  baseline  VmRSS, after resetting the kernel's peak counter (``5`` > /proc/self/clear_refs resets VmHWM)
  kept      VmRSS after the forward + loss (queue drained) - baseline: what the graph keeps for backward
  peak      VmHWM over the whole step (forward, backward, update, grads freed) - baseline: the table's figure
  after     VmRSS after the step - baseline (should be ~0: nothing cached or leaked)
  fwd       VmHWM - VmRSS over one eval-mode forward without autodiff (the sanity floor)

Allocator: both frameworks allocate tensors with glibc (MegEngine's CPU comp node: posix_memalign / free, no
pool; PyTorch's CPU allocator: posix_memalign, no caching). ``--malloc fixed`` (default) runs every process with
MALLOC_MMAP_THRESHOLD_=65536 (a fixed threshold also switches off glibc's dynamic threshold) and
MALLOC_TRIM_THRESHOLD_=1048576, so every tensor >= 64 KiB is its own mmap, returned to the kernel when freed:
RSS then follows the live tensors instead of the heap's high-water mark, and a tensor freed in warm-up cannot
hide in the baseline. ``--malloc default`` keeps glibc's defaults (for comparison). Also printed: the bytes of
activations a plain conv -> BN -> ReLU graph must keep (the input of every conv but the first, the input of every
BN, the output of every ReLU; max-pool indices) counted from the ResNets' shapes, and PyTorch's own count of
the distinct activation storages its graph saves (``saved_tensors_hooks``, parameters and the input excluded).
Table: medians over ``--repeats`` processes, MiB. ``--results FILE`` appends the medians (step peak, kept after
the forward) and the ratios fused / PyTorch and fused / unfused per model.
"""
import argparse
import gc
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import basebn.layers.bn_act as bn_act  # noqa: E402
import basebn.models  # noqa: E402,F401  (imports the model families, and with them their ``with_act`` names)
from basebn.layers.bn_act import has_act  # noqa: E402
from benchmarks import bench_train_step as bts  # noqa: E402
from results_file import add_results_argument, save_run  # noqa: E402

MARK = bts.MARK
MIB = 1 << 20
RUNNERS = ("fused", "unfused", "torch")
MALLOC_FIXED = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "1048576"}


# ------------------------------------------------------------------------------------ /proc helpers
def _status():
    """{'VmRSS': MiB, 'VmHWM': MiB} of this process."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, val = line.split(":")
                out[key] = int(val.split()[0]) / 1024.0
    return out


def _reset_peak():
    """Reset VmHWM to the current VmRSS (Linux >= 4.0); returns whether it took."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    s = _status()
    return abs(s["VmHWM"] - s["VmRSS"]) < 1.0


# ------------------------------------------------------------------------------------ basebn runner
def _unfused_patch():
    """Replace ``with_act`` by ``lambda norm, act: norm`` wherever basebn holds it; returns an undo function."""
    original, patched = bn_act.with_act, []
    for name, mod in list(sys.modules.items()):
        if (name == "basebn" or name.startswith("basebn.")) and getattr(mod, "with_act", None) is original:
            setattr(mod, "with_act", lambda norm, act: norm)
            patched.append(mod)

    def undo():
        for mod in patched:
            mod.with_act = original
    return undo


def megengine_worker(args):
    import megengine as mge
    import megengine.functional as F

    if args.batch_scale != 1:
        name, kw, shape, batch, classes = bts.MODELS[args.model]
        bts.MODELS[args.model] = (name, kw, shape, batch * args.batch_scale, classes)
    undo = _unfused_patch() if args.worker == "unfused" else (lambda: None)
    try:
        r = bts.MegEngineRunner("basebn", args.model, "cpu0")
    finally:
        undo()
    fused_layers = sum(1 for m in r.model.modules() if has_act(m))
    mems = {}

    def step(mark=None):
        with r.gm:
            loss = F.nn.cross_entropy(r.model(r.x), r.y)
            if mark:
                mge._full_sync()
                mems["kept"] = _status()["VmRSS"]
            r.gm.backward(loss)
        r.optimizer.step()
        r.optimizer.clear_grad()
        loss.item()
        mge._full_sync()

    def forward_only():
        r.model.eval()
        r.model(r.x).numpy()
        mge._full_sync()
        r.model.train()

    for _ in range(args.warmup):
        step()
    forward_only()
    _reply(_measure(step, forward_only, mems, mge._full_sync, params=r.params, fused_layers=fused_layers,
                    batch=int(r.x.shape[0])))


def _measure(step, forward_only, mems, sync, **info):
    gc.collect()
    sync()
    ok = _reset_peak()
    base = _status()["VmRSS"]
    t0 = time.perf_counter()
    step(mark=True)
    dt = time.perf_counter() - t0
    s = _status()
    gc.collect()
    sync()
    _reset_peak()
    fbase = _status()["VmRSS"]
    forward_only()
    fwd = _status()["VmHWM"] - fbase
    return dict(info, reset_ok=ok, baseline=base, kept=mems["kept"] - base, peak=s["VmHWM"] - base,
                after=s["VmRSS"] - base, fwd=fwd, step_s=dt)


def _reply(obj):
    sys.stdout.write(MARK + json.dumps(obj) + "\n")
    sys.stdout.flush()


# ------------------------------------------------------------------------------------ PyTorch runner
_TORCH_SPLIT = "\ntorch.manual_seed(0)"  # TORCH_WORKER: model code (imports, classes, build) above this line

TORCH_MEASURE = r'''
import gc, os, sys, time
''' + inspect.getsource(_status) + inspect.getsource(_reset_peak) + inspect.getsource(_measure) + r'''
key, scale, lr, momentum, wd, warmup = (sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]),
                                        float(sys.argv[5]), int(sys.argv[6]))
torch.manual_seed(0)
torch.set_num_threads(1)
model, shape, classes = build(key)
shape = (shape[0] * scale,) + tuple(shape[1:])
model.train()
decay = [p for p in model.parameters() if p.ndim > 1]
other = [p for p in model.parameters() if p.ndim <= 1]
opt = torch.optim.SGD([{"params": decay, "weight_decay": wd}, {"params": other, "weight_decay": 0.0}],
                      lr=lr, momentum=momentum)
x = torch.randn(shape)
y = torch.randint(0, classes, (shape[0],))
mems = {}

def step(mark=None):
    loss = F.cross_entropy(model(x), y)
    if mark:
        mems["kept"] = _status()["VmRSS"]
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    loss.item()

def forward_only():
    model.eval()
    with torch.no_grad():
        model(x)
    model.train()

def saved_activation_bytes():
    """Distinct storages the autograd graph saves, parameters and the input excluded."""
    skip = {p.untyped_storage().data_ptr() for p in model.parameters()} | {x.untyped_storage().data_ptr()}
    seen = {}
    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in skip:
            seen[s.data_ptr()] = s.nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = F.cross_entropy(model(x), y)
    del loss
    opt.zero_grad(set_to_none=True)
    return sum(seen.values())

for _ in range(warmup):
    step()
forward_only()
res = _measure(step, forward_only, mems, lambda: None, params=sum(p.numel() for p in model.parameters()),
               fused_layers=0, batch=shape[0])
res.update(saved=saved_activation_bytes() / 2 ** 20, version=torch.__version__, threads=torch.get_num_threads())
print(MARK + json.dumps(res), flush=True)
'''


def torch_script():
    """The PyTorch measurement: bench_train_step's model code, then TORCH_MEASURE."""
    head, sep, _ = bts.TORCH_WORKER.partition(_TORCH_SPLIT)
    if not sep:
        raise RuntimeError("bench_train_step.TORCH_WORKER changed: its model code no longer ends at "
                           f"{_TORCH_SPLIT.strip()!r}")
    return head + "\n" + TORCH_MEASURE


# ------------------------------------------------------------------------------------ analytic count
def _resnet_kept_bytes(depths, widths, cin, hw, batch, imagenet, classes):
    """Bytes a plain conv -> BN -> ReLU ResNet graph keeps for backward (float32, the input excluded): the
    output of every conv (a BN's input), of every ReLU (the next conv's input), the max-pool's output and
    int64 indices, the pooled features (the fc's input) and the log-softmax."""
    elems, extra = 0, 0
    h = hw
    if imagenet:
        h = (h + 1) // 2
        elems += 2 * widths[0] * h * h  # stem conv out, relu out
        h = (h + 1) // 2
        elems += widths[0] * h * h  # max-pool out
        extra += 8 * widths[0] * h * h  # its indices (int64)
    else:
        elems += 2 * widths[0] * h * h
    c = widths[0]
    for i, (d, w) in enumerate(zip(depths, widths)):
        for j in range(d):
            stride = 2 if i > 0 and j == 0 else 1
            h = (h + stride - 1) // stride
            elems += 4 * w * h * h  # conv1 out, relu1 out, conv2 out, relu2 out (the block's output)
            if stride != 1 or c != w:
                elems += w * h * h  # downsample conv out (its BN's input)
            c = w
    elems += c + classes
    return 4 * elems * batch, extra * batch


def analytic_mib(model, scale):
    """(kept MiB with the max-pool's int64 indices, without them: MegEngine's max-pool keeps none) of the
    plain-graph count for the ResNets, None for the others."""
    _, _, (cin, hw, _), batch, classes = bts.MODELS[model]
    batch *= scale
    if model == "resnet20":
        kept, idx = _resnet_kept_bytes([3, 3, 3], [16, 32, 64], cin, hw, batch, False, classes)
    elif model == "resnet18":
        kept, idx = _resnet_kept_bytes([2, 2, 2, 2], [64, 128, 256, 512], cin, hw, batch, True, classes)
    else:
        return None
    return (kept + idx) / MIB, kept / MIB


# ------------------------------------------------------------------------------------ driver
def run_one(args, runner, model, script):
    env = dict(bts.thread_env(1), **(MALLOC_FIXED if args.malloc == "fixed" else {}))
    if runner == "torch":
        argv = [args.torch, script, model, str(args.batch_scale), str(bts.LR), str(bts.MOMENTUM),
                str(bts.WEIGHT_DECAY), str(args.warmup)]
    else:
        argv = [sys.executable, os.path.abspath(__file__), "--worker", runner, "--model", model,
                "--batch-scale", str(args.batch_scale), "--warmup", str(args.warmup)]
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    for line in p.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    raise RuntimeError(f"{runner} {model} failed (rc {p.returncode}):\n{p.stderr[-3000:]}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(bts.MODELS), choices=list(bts.MODELS))
    ap.add_argument("--runners", nargs="+", default=list(RUNNERS), choices=RUNNERS)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batch-scale", type=int, default=1, help="multiply every model's batch (method check)")
    ap.add_argument("--malloc", choices=["fixed", "default"], default="fixed")
    ap.add_argument("--torch-python", help="a python with torch (else bench_train_step's CACHE/torchvenv)")
    ap.add_argument("--install-torch", action="store_true", help="create CACHE/torchvenv and pip install torch")
    ap.add_argument("--json", help="write every measurement here")
    ap.add_argument("--worker", choices=["fused", "unfused"], help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    add_results_argument(ap)
    args = ap.parse_args(argv)
    if args.worker:
        return megengine_worker(args)
    with open("/proc/self/clear_refs", "w") as f:  # fail early where the peak counter cannot be reset
        f.write("5")
    runners = list(args.runners)
    args.torch = bts.torch_python(args) if "torch" in runners else None
    if "torch" in runners and not args.torch:
        print("PyTorch not found: pass --torch-python PY or --install-torch; running without it")
        runners.remove("torch")
    t_start = time.perf_counter()
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench_activation_memory_") as tmp:
        script = os.path.join(tmp, "torch_memory.py")
        with open(script, "w") as f:
            f.write(torch_script())
        for model in args.models:
            for rep in range(args.repeats):
                order = runners if rep % 2 == 0 else runners[::-1]
                for runner in order:
                    res = run_one(args, runner, model, script)
                    results.setdefault(model, {}).setdefault(runner, []).append(res)
                    print(f"# {model:8s} {runner:7s} rep {rep}: peak {res['peak']:7.1f}  kept {res['kept']:7.1f}  "
                          f"fwd {res['fwd']:6.1f}  after {res['after']:5.1f}  baseline {res['baseline']:6.1f} MiB  "
                          f"step {res['step_s']:.2f} s  fused layers {res['fused_layers']}"
                          + ("" if res["reset_ok"] else "  (VmHWM reset FAILED)"), flush=True)
    print_tables(args, results)
    print(f"\n{len(args.models) * len(runners) * args.repeats} processes, "
          f"{time.perf_counter() - t_start:.0f} s; malloc: "
          + (" ".join(f"{k}={v}" for k, v in MALLOC_FIXED.items()) if args.malloc == "fixed" else "glibc defaults"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": {k: v for k, v in vars(args).items() if k != "worker"}, "results": results}, f,
                      indent=1)
    save_run(args.results, "benchmarks/bench_activation_memory.py", "memory", [1],
             results_figures(args.models, runners, results),
             "activation memory of one training step at 1 thread (ResNet-20 b128, ResNet-18 3×112² b32, MobileNetV2 "
             "3×112² b32): step peak and what is kept after the forward",
             conditions=f"each measurement a fresh process; peak RSS of one step over the RSS before it; medians of "
                        f"{args.repeats}; malloc {args.malloc}", torch_python=args.torch, argv=argv)


def results_figures(models, runners, results):
    """results/activation_memory.json's layout: per model, the medians (MiB) of the step peak and of what is kept
    after the forward, one per runner in ``columns`` order, and the ratios fused / PyTorch and fused / unfused."""
    columns = [r for r in RUNNERS if r in runners]
    figures = {"columns": [{"torch": "torch eager"}.get(r, r) for r in columns]}
    for model in models:
        for key, name in (("peak", "step_peak_mib"), ("kept", "kept_after_forward_mib")):
            figures.setdefault(name, {})[model] = [round(_med(results, model, r, key), 1) for r in columns]
        fused = _med(results, model, "fused", "peak")
        for other, name in (("torch", "fused_over_torch"), ("unfused", "fused_over_unfused")):
            ref = _med(results, model, other, "peak") if other in runners else None
            if fused is not None and ref:
                figures.setdefault(name, {})[model] = round(fused / ref, 3)
    return figures


def _med(results, model, runner, key):
    rows = results.get(model, {}).get(runner)
    return statistics.median(r[key] for r in rows) if rows else None


def print_tables(args, results):
    def f(v, spec=".1f"):
        return "-" if v is None else format(v, spec)

    def ratio(a, b):
        return "-" if a is None or b is None or b <= 0 else f"{a / b:.2f}"

    scale = f" (batch x{args.batch_scale})" if args.batch_scale != 1 else ""
    print(f"\nPeak activation memory of one training step{scale}: VmHWM over the step - VmRSS before it, "
          f"MiB, median of {args.repeats}\n")
    print("| model | basebn fused | basebn unfused | PyTorch eager | fused/PyTorch | fused/unfused |")
    print("|---|---:|---:|---:|---:|---:|")
    for m in args.models:
        fu, un, pt = (_med(results, m, r, "peak") for r in RUNNERS)
        print(f"| {m} | {f(fu)} | {f(un)} | {f(pt)} | {ratio(fu, pt)} | {ratio(fu, un)} |")
    print("\nKept after the forward (VmRSS after forward + loss - before), forward-only peak (eval, no autodiff), "
          "analytic plain-graph count, PyTorch's saved activation storages; MiB, medians\n")
    print("| model | batch | kept fused | kept unfused | kept PyTorch | fwd fused | fwd unfused | fwd PyTorch "
          "| analytic | PyTorch saved | fused layers f/u |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for m in args.models:
        kept = [_med(results, m, r, "kept") for r in RUNNERS]
        fwd = [_med(results, m, r, "fwd") for r in RUNNERS]
        rows = [results.get(m, {}).get(r) for r in RUNNERS]
        batch = next((rw[0]["batch"] for rw in rows if rw), "-")
        nf = "/".join(str(rw[0]["fused_layers"]) if rw else "-" for rw in rows[:2])
        print(f"| {m} | {batch} | " + " | ".join(f(v) for v in kept + fwd)
              + f" | {_analytic_cell(m, args.batch_scale)} | {f(_med(results, m, 'torch', 'saved'))} | {nf} |")


def _analytic_cell(model, scale):
    a = analytic_mib(model, scale)
    if a is None:
        return "-"
    return f"{a[0]:.1f}" if abs(a[0] - a[1]) < 0.05 else f"{a[0]:.1f} ({a[1]:.1f} w/o pool indices)"


if __name__ == "__main__":
    main()
