"""One CPU training step (forward, backward, SGD update, loss.item()): basebn vs plain MegEngine vs PyTorch.

    .venv/bin/python benchmarks/bench_train_step.py [--models resnet20 resnet18 mbnetv2] [--threads 1 2]
        [--runners basebn library library-inplace basebn-poller basebn-passive basebn-mmap basebn-blocked
         basebn-portable basebn-untuned basebn-cpu0 mge torch torchc]
        [--rounds 4] [--steps 2] [--warmup 2] [--torch-python PY | --install-torch] [--json OUT] [--profile]
        [--results results/train_step.json]
        [--same-window]

Models: ResNet-20 width 16 (small stem) on 1x28x28 batch 128; ResNet-18 (ImageNet stem) on 3x112x112
batch 32; MobileNetV2 x1.0 on 3x112x112 batch 32. Runners, each in its own process with the same
thread count (OMP/MKL/OpenBLAS/BASEBN_NUM_THREADS and torch.set_num_threads):
  basebn  build_model(...) as the trainer builds it (basebn Conv2d, BatchNorm2d), build_optimizer's SGD, in a
          process started as basebn.train starts (tune_cpu_runtime, then use_inline_cpu_device: cpu:default)
  library a user's own loop (docs/library.md): ``import basebn`` (which tunes the process as the CLIs start) and
          ``basebn.setup_cpu_training()``, then basebn's model from ``basebn.models.build_model``, MegEngine's
          ``optim.SGD`` over all parameters and ``GradManager``, nothing else of basebn's
  library-inplace as library, with basebn.engine.optimizer.InplaceSGD (same arguments) for MegEngine's SGD
  basebn-poller   as basebn, but MegEngine's event poller keeps its priority (lower_event_poller_priority skipped)
  basebn-passive  as basebn, but with OMP_WAIT_POLICY=PASSIVE in its environment (no GOMP_SPINCOUNT from
          use_inline_cpu_device: the OpenMP worker sleeps after every parallel region)
  basebn-mmap     as basebn, but with MALLOC_MMAP_MAX_=65536 in its environment: glibc maps blocks over 32 MiB on
          their own and unmaps them when freed (tune_cpu_runtime keeps a user's value), so they are faulted
          in afresh each step (glibc's default; tune_cpu_runtime keeps large blocks in the heap)
  basebn-blocked  as basebn, but with BASEBN_CONV_PLAIN_1X1=0 and BASEBN_CONV_DEPTHWISE=0 in its environment:
          every conv on oneDNN's blocked kernels behind NCHW <-> blocked reorders, the pointwise and depthwise ones
          too (no NCHW kernels)
  basebn-portable as basebn, but with BASEBN_KERNEL_PORTABLE=1 in its environment: the kernel library built
          without -mavx2 (SSE2 vectors) on a CPU with AVX2
  basebn-untuned  the same with MegEngine's and glibc's default device (cpu0), worker spin and malloc settings
          (BASEBN_TUNE_CPU=0: ``import basebn`` leaves them alone)
  basebn-cpu0     tuned, but on MegEngine's cpu0 device (its kernels on a dispatcher thread) instead of cpu:default
  mge     the same model with every conv / BN turned into plain M.Conv2d / M.BatchNorm2d, MegEngine's SGD,
          MegEngine's and glibc's defaults as basebn-untuned
  torch   a hand-written PyTorch equivalent (same shapes; parameter counts printed), SGD with the same
          momentum / weight decay groups; run with --torch-python (or --install-torch: CACHE/torchvenv)
  torchc  the PyTorch runner with torch.compile (inductor, CPU; compiled in the warm-up steps): the higher anchor
MegEngine runs on ``--mge-device``: default, the runner's own (``basebn``, ``library``: cpu:default, as basebn.train;
``basebn-untuned``, ``basebn-cpu0``, ``mge``: cpu0); ``cpu0`` or ``multithread`` (``multithreadT:0``) for all.
Rounds alternate A B C, C B A, ...; each step is timed inside its process (medians and minima printed, ratios of
medians to torch). ``--same-window``: per model, every thread count's
runners start together and alternate as one set, so each 1 -> N-thread speed-up is measured under one stretch of
the host's load (this VM's load moves steps ±20% within minutes), and basebn's speed-up over PyTorch's is also
taken round by round (each round's four measurements are neighbours in time), printed as a median with a bootstrap
95% interval over rounds. ``--pin-cores``: every runner process restricted to as many cores as it has threads
(``1 -> 2 cores`` rather than ``1 -> 2 threads``: a 1-thread basebn runner otherwise runs its Python and MegEngine's
event poller on the idle second core). ``--profile``: basebn's step split by phase
(synchronised wall times) and by op kind (MegEngine's profiler with synchronous dispatch, so a kernel's
span is its compute, not queue waits; the numpy weight gradient and its host copies timed around the
calls), plus torch.profiler's split of the PyTorch step. Per-conv-shape times: bench_conv_backends.py.
"""
import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import shlex
import time

import numpy as np

import megengine as mge
import megengine.functional as F
import megengine.module as M
import megengine.optimizer as optim
from megengine.autodiff import GradManager
from megengine.core._imperative_rt.common import CompNode
from megengine.utils.profiler import Profiler

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
if os.path.join(ROOT, "benchmarks") not in sys.path:  # results_file, also when imported as benchmarks.bench_train_step
    sys.path.append(os.path.join(ROOT, "benchmarks"))

import basebn  # noqa: E402
import basebn.layers.conv as conv_module  # noqa: E402
from basebn.cli import quiet_device_probe  # noqa: E402
from basebn.config import BaseConfig  # noqa: E402
from basebn.engine.ema import ModelEMA  # noqa: E402
from basebn.engine.optimizer import build_optimizer, param_groups  # noqa: E402
from basebn.layers.module_tree import replace_modules  # noqa: E402
from basebn.models import build_model  # noqa: E402
from basebn.utils.cpu_runtime import TUNE_SWITCH, tune_cpu_runtime, use_inline_cpu_device  # noqa: E402
from results_file import add_results_argument, append_run, run_record, version_in  # noqa: E402

CACHE = os.path.abspath(os.environ.get("BASEBN_BENCH_CACHE")
                        or os.path.join(os.path.expanduser("~"), ".cache", "basebn", "bench"))
MARK = "@@bench "  # worker replies start with it (MegEngine prints its own lines to stdout too)
# name: (basebn model, build kwargs, input shape C,H,W, batch, classes)
MODELS = {
    "resnet20": ("resnet20", dict(in_channels=1), (1, 28, 28), 128, 10),
    "resnet18": ("resnet18", dict(in_channels=3, stem="imagenet"), (3, 112, 112), 32, 1000),
    "mbnetv2": ("mbnetv2_x100", dict(in_channels=3), (3, 112, 112), 32, 1000),
}
LR, MOMENTUM, WEIGHT_DECAY = 0.05, 0.9, 5e-4


def thread_env(threads):
    """Environment of a runner process with ``threads`` threads everywhere."""
    t = str(threads)
    return dict(os.environ, OMP_NUM_THREADS=t, MKL_NUM_THREADS=t, OPENBLAS_NUM_THREADS=t, BASEBN_NUM_THREADS=t)


# ------------------------------------------------------------------------------------ MegEngine runners
def _plain_megengine(model):
    """``model`` with basebn's Conv2d / BatchNorm2d / MaxPool2d replaced by MegEngine's own classes (same values)."""
    def convert(m):
        if isinstance(m, M.Conv2d) and type(m) is not M.Conv2d:
            new = M.Conv2d(m.in_channels, m.out_channels, m.kernel_size, m.stride, m.padding, m.dilation,
                           m.groups, bias=m.bias is not None)
        elif isinstance(m, M.MaxPool2d) and type(m) is not M.MaxPool2d:
            return M.MaxPool2d(m.kernel_size, m.stride, m.padding)
        elif isinstance(m, M.BatchNorm2d) and type(m) is not M.BatchNorm2d:
            new = M.BatchNorm2d(m.num_features, eps=m.eps, momentum=0.9 if m.momentum is None else m.momentum,
                                affine=m.affine)
        else:
            return None
        new.load_state_dict(m.state_dict())
        return new

    return replace_modules(model, convert)


class MegEngineRunner:
    """One model's SGD step in this process, as basebn's trainer does it or in plain MegEngine."""

    def __init__(self, kind, model_key, device):
        if device:  # else the device the process started with (tune_cpu_runtime's, or MegEngine's cpu0)
            CompNode._set_default_device(device)  # (set_default_device's name check refuses "cpu:default")
        name, kwargs, shape, batch, classes = MODELS[model_key]
        mge.random.seed(0)
        model = build_model(name, num_classes=classes, **kwargs)
        if kind == "mge":
            model = _plain_megengine(model)
        model.train()
        solver = BaseConfig().solver
        solver.momentum, solver.weight_decay = MOMENTUM, WEIGHT_DECAY
        if kind == "mge":  # MegEngine's own SGD over the same parameter groups
            optimizer = optim.SGD(param_groups(model, WEIGHT_DECAY), lr=LR, momentum=MOMENTUM)
        else:
            optimizer = build_optimizer(model, solver, LR)
        self.model, self.optimizer = model, optimizer
        self.gm = GradManager().attach(model.parameters())
        rng = np.random.default_rng(0)
        self.x = mge.tensor(rng.standard_normal((batch,) + shape).astype(np.float32))
        self.y = mge.tensor(rng.integers(0, classes, batch).astype(np.int32))
        self.params = int(sum(p.size for p in model.parameters()))

    def _forward_backward(self):
        with self.gm:
            loss = F.nn.cross_entropy(self.model(self.x), self.y)
            self.gm.backward(loss)
        return loss

    def step(self):
        """One training step; returns its wall time."""
        t0 = time.perf_counter()
        loss = self._forward_backward()
        self.optimizer.step()
        self.optimizer.clear_grad()
        loss.item()
        return time.perf_counter() - t0

    def profile(self, steps, out_dir):
        """Phase wall times (synchronised, medians over ``steps``) and per-op-kind kernel times of one step."""
        sync = mge._full_sync
        phases = {k: [] for k in ("forward", "backward", "optimizer", "loss.item", "EMA update")}
        ema = ModelEMA(self.model, 0.999)
        wgrad = {"t": 0.0, "n": 0, "tap": 0.0}
        original = getattr(conv_module, "conv_weight_grad", None)

        def timed_wgrad(*a, **k):
            t = time.perf_counter()
            out = original(*a, **k)
            wgrad["t"] += time.perf_counter() - t
            wgrad["n"] += 1
            return out

        tap = getattr(conv_module, "_WeightGradTap", None)
        tap_backward = tap.backward if tap is not None else None

        def timed_tap(fn_self, dy):
            t = time.perf_counter()
            out = tap_backward(fn_self, dy)
            wgrad["tap"] += time.perf_counter() - t
            return out

        if original is not None:
            conv_module.conv_weight_grad = timed_wgrad
        if tap is not None:
            tap.backward = timed_tap
        try:
            for _ in range(steps):
                sync()
                t0 = time.perf_counter()
                with self.gm:
                    loss = F.nn.cross_entropy(self.model(self.x), self.y)
                    sync()
                    t1 = time.perf_counter()
                    self.gm.backward(loss)
                    sync()
                t2 = time.perf_counter()
                self.optimizer.step()
                self.optimizer.clear_grad()
                sync()
                t3 = time.perf_counter()
                loss.item()
                t4 = time.perf_counter()
                ema.update(self.model)
                sync()
                t5 = time.perf_counter()
                for v, dt in zip(phases.values(), (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)):
                    v.append(dt)
            # per-kernel times: MegEngine's profiler with synchronous dispatch (async_level 0), so that a
            # kernel's span is its own compute, not time spent waiting in the queue behind host work
            kernels, profiled = {}, {"fwd+bwd wall": 0.0, "numpy_wgrad": 0.0, "tap_copies": 0.0}
            level, mge.config.async_level = mge.config.async_level, 0
            try:
                for i in range(steps):
                    for part, fn in (("fwd+bwd", self._forward_backward),
                                     ("optimizer", lambda: (self.optimizer.step(), self.optimizer.clear_grad())),
                                     ("EMA update", lambda: ema.update(self.model))):
                        d = os.path.join(out_dir, f"{part.replace('+', '_').replace(' ', '_')}_{i}")
                        sync()
                        wgrad["t"] = wgrad["tap"] = 0.0
                        t0 = time.perf_counter()
                        with Profiler(d, with_backtrace=False):
                            fn()
                            sync()
                            wall = time.perf_counter() - t0
                        if part == "fwd+bwd":
                            profiled["fwd+bwd wall"] += wall / steps
                            profiled["numpy_wgrad"] += wgrad["t"] / steps
                            profiled["tap_copies"] += (wgrad["tap"] - wgrad["t"]) / steps
                        for name, (n, sec) in _kernel_times(d).items():
                            c = kernels.setdefault(part, {}).setdefault(name, [0, 0.0])
                            c[0] += n / steps
                            c[1] += sec / steps
            finally:
                mge.config.async_level = level
        finally:
            if original is not None:
                conv_module.conv_weight_grad = original
            if tap is not None:
                tap.backward = tap_backward
        return {"phases": {k: statistics.median(v) for k, v in phases.items()},
                "profiled": profiled, "kernels": kernels}


class LibraryLoop:
    """A user's own training step (docs/library.md): basebn's model, MegEngine's SGD (every parameter decayed, as
    ``optim.SGD(model.parameters(), ...)`` is written; ``inplace``: basebn's InplaceSGD, same arguments) and
    GradManager; the trainer's code is not involved."""

    def __init__(self, model_key, inplace=False):
        name, kwargs, shape, batch, classes = MODELS[model_key]
        mge.random.seed(0)
        self.model = basebn.models.build_model(name, num_classes=classes, **kwargs)
        self.model.train()
        self.gm = GradManager().attach(self.model.parameters())
        sgd = basebn.engine.optimizer.InplaceSGD if inplace else optim.SGD
        self.optimizer = sgd(self.model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
        rng = np.random.default_rng(0)
        self.x = mge.tensor(rng.standard_normal((batch,) + shape).astype(np.float32))
        self.y = mge.tensor(rng.integers(0, classes, batch).astype(np.int32))
        self.params = int(sum(p.size for p in self.model.parameters()))

    def step(self):
        """One training step as a user writes it; returns its wall time."""
        t0 = time.perf_counter()
        with self.gm:
            loss = F.nn.cross_entropy(self.model(self.x), self.y)
            self.gm.backward(loss)
        self.optimizer.step().clear_grad()
        loss.item()
        return time.perf_counter() - t0


def _kernel_times(trace_dir):
    """{op name: [count, seconds]} of the device kernels in the profiler's chrome trace."""
    files = glob.glob(os.path.join(trace_dir, "*.json"))
    events = json.load(open(files[0]))["traceEvents"] if files else []
    out, stack = {}, []
    for e in (e for e in events if e.get("cat") == "Kernel"):  # in execution order, one device thread
        if e["ph"] == "B":
            stack.append(e)
        elif stack:
            b = stack.pop()
            c = out.setdefault(b["name"], [0, 0.0])
            c[0] += 1
            c[1] += (e["ts"] - b["ts"]) * 1e-6
    return out


def op_kind(name, part):
    """The row of the profile table a MegEngine kernel named ``name`` (run in ``part``) belongs to."""
    if part != "fwd+bwd":
        return part
    low = name.lower()
    if "conv" in low:
        if "backwarddata" in low or "bwddata" in low or "bwd_data" in low:
            return "conv bwd-data"
        if any(k in low for k in ("backwardfilter", "bwdfilter", "weight", "bwdw", "bwd_w")):
            return "conv bwd-weights"
        if "bwd" in low or "backward" in low:  # BasebnConvBwd: both gradients in one op
            return "conv bwd (data + weights, one op)"
        return "conv fwd"
    if name in ("BasebnBnStats", "BasebnBnNormalize", "BatchNorm"):
        return "BN fwd (kernels)"
    if name in ("BasebnBnBackwardReduce", "BasebnBnBackwardElemt", "BatchNormBackward"):
        return "BN bwd (kernels)"
    if name.startswith("BasebnBn") and "Act" in name:  # the fused BN -> activation [+ shortcut] ops
        return "fused BN-act bwd (kernels)" if "Backward" in name else "fused BN-act fwd (kernels)"
    if name.startswith("BasebnMaxPool") or name.startswith("Pooling"):
        return "max pool (basebn ops / MegEngine's)"
    if name in ("RELU", "SWITCH_GT0", "FUSE_ADD_RELU", "ADD", "RELU6", "RELU6_GRAD", "CLIP", "MIN", "MAX"):
        return "ReLU/add/clip (elementwise)"
    if name in ("HostToDevice", "DeviceToHost", "GetValue", "Copy"):
        return "host copies"
    return "other kernels"


# runners started as basebn.train starts, each with these variables added to its environment
ENV_VARIANTS = {"basebn": {}, "basebn-poller": {}, "basebn-passive": dict(OMP_WAIT_POLICY="PASSIVE"),
                "basebn-mmap": dict(MALLOC_MMAP_MAX_="65536"),
                "basebn-blocked": dict(BASEBN_CONV_PLAIN_1X1="0", BASEBN_CONV_DEPTHWISE="0"),
                "basebn-portable": dict(BASEBN_KERNEL_PORTABLE="1")}
MEGENGINE_RUNNERS = tuple(ENV_VARIANTS) + ("library", "library-inplace", "basebn-untuned", "basebn-cpu0", "mge")
# runners whose `import basebn` must leave the process alone (basebn-poller then tunes all but the poller itself)
UNTUNED_IMPORT = {"basebn-poller", "basebn-untuned", "mge"}


def worker_main(args):
    """A MegEngine runner serving commands on stdin: run N steps, profile, quit. ``basebn`` starts as the CLIs
    do (quiet_device_probe: tune_cpu_runtime before the first operation); ``basebn-untuned`` and ``mge`` keep
    MegEngine's and glibc's defaults; ``basebn`` then runs on MegEngine's inline CPU device as basebn.train
    (use_inline_cpu_device), ``basebn-cpu0`` stays on cpu0; ``library`` is a user's own loop after the one call
    docs/library.md makes."""
    if args.worker == "basebn-poller":  # the A/B of that one setting
        tune_cpu_runtime()
        quiet_device_probe(tune=False)
    elif args.worker in ENV_VARIANTS or args.worker == "basebn-cpu0":
        quiet_device_probe()
    device = args.device
    if args.worker.startswith("library"):
        if device:
            CompNode._set_default_device(device)
        else:
            basebn.setup_cpu_training()
        runner = LibraryLoop(args.model, inplace=args.worker == "library-inplace")
    else:
        if not device and args.worker in ENV_VARIANTS:
            use_inline_cpu_device(omp_spin=True)
        elif not device:
            device = "cpu0"
        runner = MegEngineRunner("mge" if args.worker == "mge" else "basebn", args.model, device)
    for _ in range(args.warmup):
        runner.step()
    _reply({"ready": True, "params": runner.params})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["cmd"] == "run":
            _reply({"times": [runner.step() for _ in range(cmd["steps"])]})
        elif cmd["cmd"] == "profile":
            _reply({"profile": runner.profile(cmd["steps"], cmd["dir"])})
        else:
            break


def _reply(obj):
    sys.stdout.write(MARK + json.dumps(obj) + "\n")
    sys.stdout.flush()


# ------------------------------------------------------------------------------------ PyTorch runner
TORCH_WORKER = r'''
import json, statistics, sys, time
import torch
import torch.nn as nn
import torch.nn.functional as F
MARK = "@@bench "

class Basic(nn.Module):
    def __init__(self, cin, w, stride):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(cin, w, 3, stride, 1, bias=False), nn.BatchNorm2d(w)
        self.conv2, self.bn2 = nn.Conv2d(w, w, 3, 1, 1, bias=False), nn.BatchNorm2d(w)
        self.down = None
        if stride != 1 or cin != w:
            self.down = nn.Sequential(nn.Conv2d(cin, w, 1, stride, bias=False), nn.BatchNorm2d(w))
    def forward(self, x):
        idt = x if self.down is None else self.down(x)
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + idt)

class ResNet(nn.Module):
    def __init__(self, depths, widths, cin, classes, imagenet):
        super().__init__()
        if imagenet:
            self.stem = nn.Sequential(nn.Conv2d(cin, widths[0], 7, 2, 3, bias=False), nn.BatchNorm2d(widths[0]),
                                      nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        else:
            self.stem = nn.Sequential(nn.Conv2d(cin, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]),
                                      nn.ReLU())
        blocks, c = [], widths[0]
        for i, (d, w) in enumerate(zip(depths, widths)):
            for j in range(d):
                blocks.append(Basic(c, w, 2 if i > 0 and j == 0 else 1))
                c = w
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(c, classes)
    def forward(self, x):
        return self.fc(self.blocks(self.stem(x)).mean(dim=(2, 3)))

def cbr(cin, cout, k, stride=1, groups=1, act=True):
    layers = [nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    return layers + ([nn.ReLU6()] if act else [])

class InvRes(nn.Module):
    def __init__(self, cin, cout, stride, exp):
        super().__init__()
        mid = cin * exp
        layers = (cbr(cin, mid, 1) if exp != 1 else []) + cbr(mid, mid, 3, stride, mid) + cbr(mid, cout, 1, act=False)
        self.body = nn.Sequential(*layers)
        self.skip = stride == 1 and cin == cout
    def forward(self, x):
        return x + self.body(x) if self.skip else self.body(x)

class MBv2(nn.Module):
    def __init__(self, cin, classes):
        super().__init__()
        layers, c = cbr(cin, 32, 3, 2), 32
        for d, w, s, e in zip([1, 2, 3, 4, 3, 3, 1], [16, 24, 32, 64, 96, 160, 320], [1, 2, 2, 2, 1, 2, 1],
                              [1, 6, 6, 6, 6, 6, 6]):
            for j in range(d):
                layers.append(InvRes(c, w, s if j == 0 else 1, e))
                c = w
        self.features = nn.Sequential(*layers, *cbr(c, 1280, 1))
        self.drop, self.fc = nn.Dropout(0.2), nn.Linear(1280, classes)
    def forward(self, x):
        return self.fc(self.drop(self.features(x).mean(dim=(2, 3))))

def build(key):
    if key == "resnet20":
        return ResNet([3, 3, 3], [16, 32, 64], 1, 10, False), (128, 1, 28, 28), 10
    if key == "resnet18":
        return ResNet([2, 2, 2, 2], [64, 128, 256, 512], 3, 1000, True), (32, 3, 112, 112), 1000
    return MBv2(3, 1000), (32, 3, 112, 112), 1000

def kind(name):
    n = name.lower()
    if "convolution_backward" in n:
        return "conv bwd (data + weights)"
    if "conv" in n:
        return "conv fwd"
    if "batch_norm_backward" in n:
        return "BN bwd"
    if "batch_norm" in n:
        return "BN fwd"
    if any(k in n for k in ("relu", "threshold", "hardtanh", "add", "clamp")):
        return "ReLU/add/clip (elementwise)"
    return "other"

torch.manual_seed(0)
torch.set_num_threads(int(sys.argv[2]))
model, shape, classes = build(sys.argv[1])
model.train()
if sys.argv[7] == "compile":
    model = torch.compile(model)  # inductor; compiled during the warm-up steps
decay = [p for p in model.parameters() if p.ndim > 1]
other = [p for p in model.parameters() if p.ndim <= 1]
opt = torch.optim.SGD([{"params": decay, "weight_decay": float(sys.argv[5])}, {"params": other, "weight_decay": 0.0}],
                      lr=float(sys.argv[3]), momentum=float(sys.argv[4]))
x = torch.randn(shape)
y = torch.randint(0, classes, (shape[0],))

def step():
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    loss.item()
    return time.perf_counter() - t0

for _ in range(int(sys.argv[6])):
    step()
print(MARK + json.dumps({"ready": True, "params": sum(p.numel() for p in model.parameters()),
                         "version": torch.__version__, "threads": torch.get_num_threads()}), flush=True)
for line in sys.stdin:
    cmd = json.loads(line)
    if cmd["cmd"] == "run":
        out = {"times": [step() for _ in range(cmd["steps"])]}
    elif cmd["cmd"] == "profile":
        from torch.profiler import ProfilerActivity, profile
        walls = []
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(cmd["steps"]):
                walls.append(step())
        rows = {}
        for e in prof.key_averages():
            if e.key.startswith("Optimizer.step"):
                rows["optimizer"] = rows.get("optimizer", 0.0) + e.cpu_time_total * 1e-6 / cmd["steps"]
            elif e.key.startswith("aten::") and not e.key.startswith("aten::_foreach") and "sgd" not in e.key:
                k = kind(e.key)
                rows[k] = rows.get(k, 0.0) + e.self_cpu_time_total * 1e-6 / cmd["steps"]
        out = {"profile": {"kinds": rows, "step": statistics.median(walls)}}
    else:
        break
    print(MARK + json.dumps(out), flush=True)
'''


# ------------------------------------------------------------------------------------ driver
class Runner:
    """A runner process driven over a pipe; its replies are the lines starting with MARK."""

    def __init__(self, name, argv, env, log, cores=None):
        self.name = name
        self.log = open(log, "w")
        pin = None if cores is None else (lambda: os.sched_setaffinity(0, cores))  # every thread it starts too
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                     text=True, env=env, cwd=ROOT, preexec_fn=pin)
        self.info = self._read()

    def _read(self):
        for line in self.proc.stdout:
            if line.startswith(MARK):
                return json.loads(line[len(MARK):])
        raise RuntimeError(f"runner {self.name} died (log: {self.log.name})")

    def call(self, **cmd):
        """Send one command, return its reply."""
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self):
        """Ask the runner to stop and wait for it."""
        try:
            self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
            self.proc.stdin.close()
        except (BrokenPipeError, ValueError):
            pass
        self.proc.wait(timeout=60)
        self.log.close()


def torch_python(args):
    """The interpreter that runs the PyTorch runner, creating CACHE/torchvenv with --install-torch."""
    if args.torch_python:
        return args.torch_python
    py = os.path.join(CACHE, "torchvenv", "bin", "python")
    if not os.path.exists(py) and args.install_torch:
        subprocess.run([sys.executable, "-m", "venv", os.path.dirname(os.path.dirname(py))], check=True)
        subprocess.run([py, "-m", "pip", "install", "-q", "torch", "numpy"], check=True)
    return py if os.path.exists(py) else None


def start_runners(args, model, threads, tmp):
    env = thread_env(threads)
    cores = set(sorted(os.sched_getaffinity(0))[:threads]) if args.pin_cores else None
    device = {"default": "", "cpu0": "cpu0", "multithread": "cpu0" if threads == 1 else f"multithread{threads}:0"}[
        args.mge_device]
    runners = []
    for kind in args.runners:
        log = os.path.join(tmp, f"{kind}_{model}_{threads}.log")
        if kind in ("torch", "torchc"):
            if args.torch:
                worker = os.path.join(tmp, "torch_worker.py")
                with open(worker, "w") as f:
                    f.write(TORCH_WORKER)
                argv = [args.torch, worker, model, str(threads), str(LR), str(MOMENTUM), str(WEIGHT_DECAY),
                        str(args.warmup), "compile" if kind == "torchc" else "eager"]
                try:
                    runners.append(Runner(kind, argv, env, log, cores))
                except RuntimeError as e:  # torch.compile needs a working C++ toolchain
                    if kind == "torch":
                        raise
                    print(f"torch.compile runner skipped: {e}")
            continue
        argv = [sys.executable, os.path.abspath(__file__), "--worker", kind, "--model", model,
                "--device", device, "--warmup", str(args.warmup)]
        extra = dict(ENV_VARIANTS.get(kind, {}), **({TUNE_SWITCH: "0"} if kind in UNTUNED_IMPORT else {}))
        runners.append(Runner(kind, argv, dict(env, **extra), log, cores))
    return runners, device


def measure(runners, rounds, steps):
    """{runner name: step times}, the runners alternating A B C, C B A, ..."""
    return {runners[i].name: t for i, t in enumerate(alternate(runners, rounds, steps))}


def alternate(runners, rounds, steps):
    """Each runner's step times (a list per runner, in order), the runners alternating A B C, C B A, ..."""
    times = [[] for _ in runners]
    order = list(range(len(runners)))
    for i in range(rounds):
        for j in (order if i % 2 == 0 else order[::-1]):
            times[j] += runners[j].call(cmd="run", steps=steps)["times"]
    return times


def same_window(args):
    """Per model: the runners of every thread count started together and measured in one alternation (A1 B1 A2
    B2, B2 A2 B1 A1, ...); prints each thread count's row and every runner's speed-up from the first thread count
    to the others. Returns the per-thread results."""
    results = []
    with tempfile.TemporaryDirectory(prefix="bench_train_step_") as tmp:
        for model in args.models:
            sets = {}
            try:
                for threads in args.threads:
                    sets[threads] = start_runners(args, model, threads, tmp)
                flat = [r for runners, _ in sets.values() for r in runners]
                times = dict(zip(map(id, flat), alternate(flat, args.rounds, args.steps)))
            finally:
                for runners, _ in sets.values():
                    for r in runners:
                        r.close()
            rows = {}
            for threads, (runners, device) in sets.items():
                res = {"model": model, "threads": threads, "mge_device": device or "default",
                       "params": {r.name: r.info["params"] for r in runners},
                       "times": {r.name: times[id(r)] for r in runners}, "same_window": True}
                rows[threads] = res
                results.append(res)
                print_row(res, header=len(results) == 1)
            first = args.threads[0]
            for threads in args.threads[1:]:
                ups = {k: statistics.median(rows[first]["times"][k]) / statistics.median(rows[threads]["times"][k])
                       for k in rows[threads]["times"] if rows[threads]["times"][k] and rows[first]["times"].get(k)}
                window = "same window, 1 core per thread" if args.pin_cores else "same window"
                print(f"  {model}: {first} -> {threads}-thread speed-up ({window}): "
                      + ", ".join(f"{k} {v:.2f}" for k, v in ups.items()), flush=True)
                for ref in ("torch", "torchc"):
                    if ref in ups and "basebn" in ups:
                        mid, lo, hi = paired_speedup_ratio(rows[first]["times"], rows[threads]["times"], "basebn",
                                                           ref, args.steps)
                        rows[threads].setdefault("paired", {})[ref] = [mid, lo, hi]
                        print(f"    basebn's speed-up / {ref}'s, round by round: median {mid:.3f}, 95% bootstrap "
                              f"interval {lo:.3f}-{hi:.3f} ({args.rounds} rounds)", flush=True)
    return results


def round_medians(times, steps):
    """The median step of each round (``times`` in order, ``steps`` per round)."""
    return [statistics.median(times[i:i + steps]) for i in range(0, len(times) - steps + 1, steps)]


def paired_speedup_ratio(times_a, times_b, runner, ref, steps, resamples=4000, seed=0):
    """``runner``'s speed-up from thread count A to B over ``ref``'s, paired round by round (in a same-window
    round the four measurements are neighbours in time, so the host's load mostly cancels): the median over rounds
    and a percentile-bootstrap 95% interval of that median, resampling rounds. Returns (median, low, high)."""
    per_round = [(a1 / b1) / (a2 / b2) for a1, b1, a2, b2 in zip(
        round_medians(times_a[runner], steps), round_medians(times_b[runner], steps),
        round_medians(times_a[ref], steps), round_medians(times_b[ref], steps))]
    rng = np.random.default_rng(seed)
    boot = np.median(rng.choice(per_round, size=(resamples, len(per_round))), axis=1)
    return statistics.median(per_round), float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))


def print_profile(model, threads, prof, torch_prof):
    """The basebn step split by phase and op kind (ms), next to torch.profiler's split."""
    ph = prof["phases"]
    rows, others = {}, {}
    for part, kernels in prof["kernels"].items():
        for name, (_, sec) in kernels.items():
            k = op_kind(name, part)
            rows[k] = rows.get(k, 0.0) + sec
            if k == "other kernels":
                others[name] = others.get(name, 0.0) + sec
    pr = prof["profiled"]
    if pr["numpy_wgrad"]:
        rows["conv bwd-weights (numpy, host)"] = pr["numpy_wgrad"]
        rows["host copies at the numpy weight-grad boundary"] = pr["tap_copies"]
    fb_kernels = sum(v for k, v in rows.items() if k not in ("optimizer", "EMA update"))
    # the profiler itself slows the host down: the rest is taken from the unprofiled phase walls
    rows["host: python, dispatch (fwd+bwd wall - above)"] = max(0.0, ph["forward"] + ph["backward"] - fb_kernels)
    rows["optimizer (wall)"] = ph["optimizer"]
    rows["loss.item (wall)"] = ph["loss.item"]
    rows["EMA update (wall; not in the default step)"] = ph["EMA update"]
    print(f"\nprofile: basebn {model}, {threads} thread(s); phases (synchronised wall, ms): "
          + ", ".join(f"{k} {v * 1e3:.1f}" for k, v in ph.items())
          + f"; fwd+bwd under the profiler (synchronous dispatch): {pr['fwd+bwd wall'] * 1e3:.1f}")
    print(f"  {'op kind':58s} {'basebn ms':>10s}")
    for k, v in sorted(rows.items(), key=lambda kv: -kv[1]):
        if k in ("optimizer", "EMA update"):
            k = f"{k} (kernels)"
        print(f"  {k:58s} {v * 1e3:10.1f}")
    print("  other kernels: " + ", ".join(f"{n} {v * 1e3:.1f}" for n, v in sorted(others.items(), key=lambda kv: -kv[1])[:8]))
    if torch_prof:
        print(f"  torch.profiler, PyTorch step {torch_prof['step'] * 1e3:.1f} ms (profiled):")
        for k, v in sorted(torch_prof["kinds"].items(), key=lambda kv: -kv[1]):
            print(f"  {'torch ' + k:58s} {v * 1e3:10.1f}")
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--runners", nargs="+", default=["basebn", "library", "mge", "torch"],
                    choices=list(MEGENGINE_RUNNERS) + ["torch", "torchc"],
                    help="torchc: PyTorch with torch.compile (inductor, CPU), the higher anchor")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=2, help="timed steps per runner per round")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--mge-device", choices=["default", "cpu0", "multithread"], default="default")
    ap.add_argument("--torch-python", help="a python with torch (else CACHE/torchvenv)")
    ap.add_argument("--install-torch", action="store_true", help="create CACHE/torchvenv and pip install torch")
    ap.add_argument("--same-window", action="store_true",
                    help="per model, run every thread count's runners at once, alternating all of them, so the "
                         "1 -> N-thread speed-ups come from one stretch of the host's load")
    ap.add_argument("--pin-cores", action="store_true",
                    help="each runner process on as many cores as its threads (T threads: the first T cores this "
                         "process may use), so a 1-thread run is a 1-core run: its Python and MegEngine's other "
                         "threads share that core instead of taking an idle one")
    ap.add_argument("--profile", action="store_true", help="also profile basebn's step and PyTorch's")
    ap.add_argument("--profile-steps", type=int, default=3)
    ap.add_argument("--json", help="write the results here")
    add_results_argument(ap)
    ap.add_argument("--worker", choices=MEGENGINE_RUNNERS,
                    help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--device", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker_main(args)
    wants_torch = {"torch", "torchc"} & set(args.runners)
    args.torch = torch_python(args) if wants_torch else None
    if wants_torch and not args.torch:
        print("PyTorch not found: pass --torch-python PY or --install-torch; running without it")
    if args.same_window and args.profile:
        ap.error("--profile runs with one thread count at a time: leave out --same-window")
    results = same_window(args) if args.same_window else thread_by_thread(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if args.results:
        kind = ("same-window-pinned" if args.pin_cores else "same-window") if args.same_window else "thread-by-thread"
        record = run_record(kind, shlex.join(["benchmarks/bench_train_step.py"] + (argv or sys.argv[1:])),
                            args.threads, results_figures(results),
                            torch_version=version_in(args.torch, "torch") if args.torch else None)
        append_run(args.results, record, "benchmarks/bench_train_step.py",
                   "one CPU training step (forward, backward, SGD, loss.item()): basebn vs PyTorch")


def results_figures(results):
    """A run's figures in results/train_step.json's layout: per model, the median ms and the ratios basebn / each
    other runner per thread count (and library / torch), the first -> last thread count's speed-ups, and the paired
    ratios ([median, low, high] of basebn's speed-up over a reference's, same-window runs only)."""
    figures = {}
    for res in results:
        f = figures.setdefault(res["model"], {})
        threads = str(res["threads"])
        med = {k: statistics.median(v) * 1e3 for k, v in res["times"].items() if v}
        f.setdefault("ms", {})[threads] = {k: round(v, 1) for k, v in med.items()}
        if "basebn" in med:
            f.setdefault("ratio", {})[threads] = {f"basebn/{k}": round(med["basebn"] / v, 3)
                                                  for k, v in med.items() if k != "basebn"}
        for ref in ("torch", "torchc"):  # a user's own loop against the same anchors
            for k in ("library", "library-inplace"):
                if k in med and ref in med:
                    f.setdefault("ratio", {}).setdefault(threads, {})[f"{k}/{ref}"] = round(med[k] / med[ref], 3)
        for ref, (mid, lo, hi) in res.get("paired", {}).items():
            f.setdefault("paired", {})[ref] = {"median": round(mid, 3), "low": round(lo, 3), "high": round(hi, 3)}
    for f in figures.values():
        counts = sorted(f["ms"], key=int)
        first, last = f["ms"][counts[0]], f["ms"][counts[-1]]
        if len(counts) > 1:
            f["speedup"] = {k: round(first[k] / last[k], 3) for k in first if k in last}
    return figures


def thread_by_thread(args):
    """Per thread count and model: that set of runners measured (and profiled with --profile); prints a row each.
    Returns the results."""
    results = []
    with tempfile.TemporaryDirectory(prefix="bench_train_step_") as tmp:
        for threads in args.threads:
            for model in args.models:
                runners, device = start_runners(args, model, threads, tmp)
                try:
                    times = measure(runners, args.rounds, args.steps)
                    res = {"model": model, "threads": threads, "mge_device": device or "default",
                           "params": {r.name: r.info["params"] for r in runners}, "times": times}
                    if args.profile:
                        named = {r.name: r for r in runners}
                        prof = named["basebn"].call(cmd="profile", steps=args.profile_steps,
                                                    dir=os.path.join(tmp, f"prof_{model}_{threads}"))["profile"]
                        tprof = (named["torch"].call(cmd="profile", steps=args.profile_steps)["profile"]
                                 if "torch" in named else None)
                        res["profile"] = {"basebn": prof, "torch": tprof}
                        res["profile_rows"] = print_profile(model, threads, prof, tprof)
                finally:
                    for r in runners:
                        r.close()
                results.append(res)
                print_row(res, header=len(results) == 1)
    return results


def print_row(res, header):
    """One table line: median / min ms per runner, ratios of medians to torch (eager), basebn's to torch.compile."""
    names = list(res["times"])
    ratios = [k for k in names if k not in ("torch", "torchc")]
    if header:
        print(f"\n{'model':9s} {'thr':>3s} {'device':>14s}  " + " ".join(f"{k + ' med/min':>20s}" for k in names)
              + " " + " ".join(f"{k + '/torch':>18s}" for k in ratios) + f" {'basebn/compiled':>15s}  params")
    t = res["times"]
    med = {k: statistics.median(v) * 1e3 for k, v in t.items() if v}
    mn = {k: min(v) * 1e3 for k, v in t.items() if v}

    def cell(k, w):
        return f"{med[k]:.0f}/{mn[k]:.0f}".rjust(w) if k in med else "-".rjust(w)

    def ratio(k, w, ref="torch"):
        return f"{med[k] / med[ref]:.2f}x".rjust(w) if k in med and ref in med else "-".rjust(w)

    print(f"{res['model']:9s} {res['threads']:3d} {res['mge_device']:>14s}  " + " ".join(cell(k, 20) for k in names)
          + " " + " ".join(ratio(k, 18) for k in ratios) + f" {ratio('basebn', 15, 'torchc')}  "
          + "/".join(str(v) for v in res["params"].values()), flush=True)


if __name__ == "__main__":
    main()
