"""Pointwise and depthwise convs on NCHW kernels vs oneDNN's blocked kernels behind reorders, shape by shape.

    .venv/bin/python benchmarks/bench_conv_layout.py [--threads 1 2] [--rounds 5] [--calls 2]

basebn's conv ops run a 1x1 conv with one group and no padding over at least 14 x 14 input pixels and at most 512
input channels on oneDNN's plain-layout (gemm) kernels, reading and writing the NCHW tensors themselves
(``plain_layout`` in basebn/ops/csrc/conv_dnnl.cpp), and a depthwise conv over at least 14 x 14 pixels on basebn's
own NCHW kernels (basebn/ops/csrc/conv_depthwise_cpu.h); every other conv on blocked kernels, with NCHW <-> blocked
reorders of x, y and dy inside the op. Two worker processes per thread count alternate shape by shape, round by
round: ``nchw`` (every pointwise conv on the NCHW kernels, ``BASEBN_CONV_PLAIN_1X1=all``; depthwise as by
default) and ``blocked`` (``BASEBN_CONV_PLAIN_1X1=0`` and ``BASEBN_CONV_DEPTHWISE=0``; both read once per
process). Per shape: the median ms of the forward op and of the one-call backward (dx and dW), each synchronised,
and their sum's ratio nchw / blocked; ``rule`` says which of the two basebn runs by default (depthwise shapes
under 14 x 14 run on oneDNN in both workers: their ratio shows the noise).
Shapes: MobileNetV2 (3x112x112, batch 32), ResNet-50 bottlenecks (224 / 4, batch 32), the 1x1 stride-2
downsamples of ResNet-20 and ResNet-18, EfficientNet-style 5x5 depthwise convs, and a few past the rules' edges.
``--results FILE`` (results/conv_layout.json) appends two runs: ``layout`` (the pointwise shapes, by group) and
``depthwise`` (the depthwise shapes), each with the min-max of its groups' nchw / blocked ratios per thread count.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np

import megengine as mge

from bench_train_step import MARK, Runner, thread_env
from results_file import add_results_argument, save_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from basebn.cli import quiet_device_probe  # noqa: E402
from basebn.ops.conv_ops import ConvGeometry, conv_backward, conv_forward  # noqa: E402
from basebn.utils.cpu_runtime import use_inline_cpu_device  # noqa: E402

# (what, N, C, H, W, O, stride): pointwise; "dw" in what: depthwise 3x3 (5x5 with "5x5"), O = C
SHAPES = [
    ("mbv2 expand", 32, 24, 28, 28, 144, 1),
    ("mbv2 project", 32, 144, 28, 28, 24, 1),
    ("mbv2 expand", 32, 16, 56, 56, 96, 1),
    ("mbv2 project", 32, 96, 56, 56, 24, 1),
    ("mbv2 project", 32, 144, 56, 56, 24, 1),
    ("mbv2 expand", 32, 64, 14, 14, 384, 1),
    ("mbv2 project", 32, 384, 14, 14, 96, 1),
    ("mbv2 expand 7x7", 32, 96, 7, 7, 576, 1),
    ("mbv2 project 7x7", 32, 576, 7, 7, 160, 1),
    ("mbv2 head 4x4", 32, 320, 4, 4, 1280, 1),
    ("r50 reduce", 32, 256, 56, 56, 64, 1),
    ("r50 expand", 32, 64, 56, 56, 256, 1),
    ("r50 reduce", 32, 512, 28, 28, 128, 1),
    ("r50 reduce, C > 512", 32, 1024, 14, 14, 256, 1),
    ("r50 expand", 32, 256, 14, 14, 1024, 1),
    ("r50 reduce 7x7", 32, 2048, 7, 7, 512, 1),
    ("r20 downsample", 128, 16, 28, 28, 32, 2),
    ("r20 downsample", 128, 32, 14, 14, 64, 2),
    ("r18 downsample", 32, 64, 28, 28, 128, 2),
    ("r18 downsample", 32, 128, 14, 14, 256, 2),
    ("r50 downsample, C > 512", 32, 1024, 14, 14, 2048, 2),
    ("mbv2 dw", 32, 144, 56, 56, 144, 1),
    ("mbv2 dw", 32, 96, 56, 56, 96, 2),
    ("mbv2 dw", 32, 192, 28, 28, 192, 1),
    ("mbv2 dw", 32, 144, 28, 28, 144, 2),
    ("mbv2 dw", 32, 384, 14, 14, 384, 1),
    ("mbv2 dw 7x7 image", 32, 960, 7, 7, 960, 1),
    ("effnet dw 5x5", 32, 240, 28, 28, 240, 1),
    ("effnet dw 5x5", 32, 144, 56, 56, 144, 2),
]


def under_rule(what, c, h, w):
    """plain_layout's rule for a 1x1 conv, one group, no padding, and direct_depthwise's for a depthwise conv (kept
    in step with conv_dnnl.cpp)."""
    return h * w >= 14 * 14 and ("dw" in what or c <= 512)


# the groups of shapes a results file gives the nchw / blocked ratios of: (key, which shapes, their run's kind)
GROUPS = [
    ("MobileNetV2 pointwise, 56² to 14²", lambda what, c, h: what.startswith("mbv2") and "dw" not in what
     and h >= 14, "layout"),
    ("ResNet-50 pointwise up to 512 input channels, 56² to 14²", lambda what, c, h: what.startswith("r50")
     and "downsample" not in what and c <= 512 and h >= 14, "layout"),
    ("1x1 stride-2 downsamples of ResNet-20 / ResNet-18", lambda what, c, h: what in ("r20 downsample",
                                                                                         "r18 downsample"), "layout"),
    ("left blocked by the rules: 7² and 4² maps, 1024+ input channels", lambda what, c, h: "dw" not in what
     and not under_rule(what, c, h, h), "layout"),
    ("mbnetv2 3x3 56-14, both strides", lambda what, c, h: what == "mbv2 dw" and h >= 14, "depthwise"),
    ("5x5 (EfficientNet)", lambda what, c, h: what.startswith("effnet"), "depthwise"),
    ("7x7 image (noise)", lambda what, c, h: what == "mbv2 dw 7x7 image", "depthwise"),
]


def span(values):
    return {"min": round(min(values), 3), "max": round(max(values), 3)}


def results_figures(ratios):
    """{kind: figures} from ``ratios`` ({threads: {shape index: nchw / blocked}}), in results/conv_layout.json's
    layout: ``layout``: pointwise_rule_nchw (the pointwise shapes basebn runs on NCHW kernels),
    left_blocked_if_moved, nchw_over_blocked_with_reorders (per group); ``depthwise``: depthwise_nchw_over_jit_dw."""
    layout = {"pointwise_rule_nchw": {}, "left_blocked_if_moved": {}, "nchw_over_blocked_with_reorders": []}
    depthwise = {"depthwise_nchw_over_jit_dw": {}}
    for threads, by_shape in ratios.items():
        t = str(threads)
        pointwise = [(i, r) for i, r in by_shape.items() if "dw" not in SHAPES[i][0]]
        ruled = [r for i, r in pointwise if under_rule(SHAPES[i][0], SHAPES[i][2], SHAPES[i][3], SHAPES[i][4])]
        left = [r for i, r in pointwise if not under_rule(SHAPES[i][0], SHAPES[i][2], SHAPES[i][3], SHAPES[i][4])]
        if ruled:
            layout["pointwise_rule_nchw"][t] = span(ruled)
        if left:
            layout["left_blocked_if_moved"][t] = span(left)
        for key, member, kind in GROUPS:
            group = [r for i, r in by_shape.items() if member(SHAPES[i][0], SHAPES[i][2], SHAPES[i][3])]
            if not group:
                continue
            if kind == "depthwise":
                depthwise["depthwise_nchw_over_jit_dw"].setdefault(key, {})[t] = span(group)
            else:
                rows = layout["nchw_over_blocked_with_reorders"]
                row = next((r for r in rows if r["convs"] == key), None)
                if row is None:
                    row = {"convs": key}
                    rows.append(row)
                row[f"{threads} thread" + ("s" if threads > 1 else "")] = span(group)
    return {"layout": layout, "depthwise": depthwise}


def conv_of(what, c, o, stride):
    """(weight shape, geometry) of a shape row."""
    if "dw" in what:
        k = 5 if "5x5" in what else 3
        return (c, 1, 1, k, k), ConvGeometry((stride, stride), (k // 2, k // 2), (1, 1), c)
    return (o, c, 1, 1), ConvGeometry((stride, stride), (0, 0), (1, 1), 1)


def worker(args):
    quiet_device_probe()
    use_inline_cpu_device(omp_spin=True)
    rng = np.random.default_rng(0)
    print(MARK + json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["cmd"] != "run":
            break
        what, n, c, h, w, o, s = SHAPES[cmd["shape"]]
        w_shape, geom = conv_of(what, c, o, s)
        x = mge.tensor(rng.standard_normal((n, c, h, w)).astype(np.float32))
        wt = mge.tensor(rng.standard_normal(w_shape).astype(np.float32))
        dy = mge.tensor(rng.standard_normal(tuple(conv_forward(x, wt, None, geom).shape)).astype(np.float32))
        conv_backward(dy, wt, x, geom)
        mge._full_sync()
        fwd, bwd = [], []
        for _ in range(cmd["calls"]):
            t0 = time.perf_counter()
            conv_forward(x, wt, None, geom)
            mge._full_sync()
            t1 = time.perf_counter()
            conv_backward(dy, wt, x, geom)
            mge._full_sync()
            fwd.append(t1 - t0)
            bwd.append(time.perf_counter() - t1)
        print(MARK + json.dumps({"fwd": fwd, "bwd": bwd}), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--rounds", type=int, default=5, help="alternations of the two workers per shape")
    ap.add_argument("--calls", type=int, default=2, help="timed forward + backward calls per worker per round")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    add_results_argument(ap)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    ratios = {}
    tmp = tempfile.mkdtemp(prefix="bench_conv_layout_")
    argv = [sys.executable, os.path.abspath(__file__), "--worker"]
    for threads in args.threads:
        env = thread_env(threads)
        workers = {"nchw": Runner("nchw", argv, dict(env, BASEBN_CONV_PLAIN_1X1="all"),
                                  os.path.join(tmp, f"nchw_{threads}.log")),
                   "blocked": Runner("blocked", argv, dict(env, BASEBN_CONV_PLAIN_1X1="0", BASEBN_CONV_DEPTHWISE="0"),
                                     os.path.join(tmp, f"blocked_{threads}.log"))}
        print(f"\n{threads} thread(s): median ms, forward and backward (dx + dW in one op)")
        print(f"{'shape':26s} {'N x C x H x W -> O, stride':30s} {'rule':>4s} {'fwd nchw':>8s} {'blocked':>8s} "
              f"{'bwd nchw':>8s} {'blocked':>8s} {'nchw/blocked':>12s}")
        for i, (what, n, c, h, w, o, s) in enumerate(SHAPES):
            times = {k: {"fwd": [], "bwd": []} for k in workers}
            for r in range(args.rounds):
                for k in (("nchw", "blocked") if r % 2 == 0 else ("blocked", "nchw")):
                    reply = workers[k].call(cmd="run", shape=i, calls=args.calls)
                    times[k]["fwd"] += reply["fwd"]
                    times[k]["bwd"] += reply["bwd"]
            med = {(k, op): 1e3 * statistics.median(v) for k, ops in times.items() for op, v in ops.items()}
            ratio = (med["nchw", "fwd"] + med["nchw", "bwd"]) / (med["blocked", "fwd"] + med["blocked", "bwd"])
            rule = "nchw" if under_rule(what, c, h, w) else "blk"
            ratios.setdefault(threads, {})[i] = ratio
            print(f"{what:26s} {f'{n}x{c}x{h}x{w} -> {o}, s{s}':30s} {rule:>4s} "
                  f"{med['nchw', 'fwd']:8.2f} {med['blocked', 'fwd']:8.2f} {med['nchw', 'bwd']:8.2f} "
                  f"{med['blocked', 'bwd']:8.2f} {ratio:12.2f}", flush=True)
        for runner in workers.values():
            runner.close()
    what = ("pointwise and depthwise convs on NCHW kernels (no layout reorders) vs oneDNN's blocked kernels with "
            "their reorders, forward + backward per op")
    for kind, figures in results_figures(ratios).items():
        save_run(args.results, "benchmarks/bench_conv_layout.py", kind, args.threads, figures, what,
                 conditions="the two layouts alternating, shape by shape; nchw / blocked of forward + backward")


if __name__ == "__main__":
    main()
