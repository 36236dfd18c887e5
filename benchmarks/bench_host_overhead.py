"""The host side of basebn's CPU training step: how much Python it runs, and what that Python costs the step.

    .venv/bin/python benchmarks/bench_host_overhead.py [--models resnet20 resnet18 mbnetv2] [--threads 1 2]
        [--rounds 12] [--added-ms 100] [--tiny-steps 30]

Per model and thread count, in one process started as basebn.train starts (bench_train_step's ``basebn`` runner):
  tiny input   the model on a 2 x C x 32 x 32 batch, where the arithmetic is negligible: Python function calls per
               step (cProfile, deterministic) and the main thread's CPU time per step (``time.thread_time``, median);
  added Python the benchmark's input size, steps alternating with and without ``--added-ms`` of main-thread CPU per
               step, a busy loop split over the convs (forward pre-hooks): the step's median wall time both ways,
               and the slope, extra step time per ms of extra Python. MegEngine runs kernels on its own worker thread,
               so the Python thread competes for a core only when every core computes.
The slope times the tiny-input CPU time estimates what the Python of a step costs at that thread count.
``--results FILE`` (results/host_overhead.json) appends, per thread count T, ``slope_T_threads`` (min-max over the
models) and ``cost_share_T_threads`` per model: the cost over the step's time, ``v`` from all rounds, ``min`` and
``max`` from the slopes of the first and the second half of the rounds.
"""
import argparse
import cProfile
import json
import os
import pstats
import statistics
import subprocess
import sys
import time

import megengine.module as M

from bench_train_step import MODELS, MegEngineRunner, thread_env
from results_file import add_results_argument, save_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from basebn.cli import quiet_device_probe  # noqa: E402
from basebn.utils.cpu_runtime import use_inline_cpu_device  # noqa: E402


def _runner(model_key, tiny):
    if tiny:  # same model, negligible arithmetic: the step is its dispatch
        name, kwargs, shape, _, classes = MODELS[model_key]
        MODELS[model_key] = (name, kwargs, (shape[0], 32, 32), 2, classes)
    runner = MegEngineRunner("basebn", model_key, None)
    for _ in range(3):
        runner.step()
    return runner


def tiny_input(model_key, steps):
    """Python calls per step and median main-thread CPU ms per step, on a 2 x C x 32 x 32 batch."""
    runner = _runner(model_key, tiny=True)
    cpu = []
    for _ in range(steps):
        t0 = time.thread_time()
        runner.step()
        cpu.append(time.thread_time() - t0)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(5):
        runner.step()
    prof.disable()
    return {"calls": pstats.Stats(prof).total_calls / 5, "cpu_ms": 1e3 * statistics.median(cpu)}


def added_python(model_key, rounds, added_ms):
    """Median step wall ms without and with ``added_ms`` of main-thread CPU per step (split over the convs), steps
    alternating."""
    runner = _runner(model_key, tiny=False)
    convs = [m for m in runner.model.modules() if isinstance(m, M.Conv2d)]
    burn_us = 1e3 * added_ms / len(convs)
    state = {"on": False}

    def burn(module, inputs):
        if state["on"]:
            end = time.thread_time() + burn_us * 1e-6
            while time.thread_time() < end:
                pass

    for conv in convs:
        conv.register_forward_pre_hook(burn)
    times = {False: [], True: []}
    for i in range(rounds):
        for on in ((False, True) if i % 2 == 0 else (True, False)):
            state["on"] = on
            times[on].append(runner.step())
    plain, burned = (1e3 * statistics.median(times[k]) for k in (False, True))
    half = max(1, rounds // 2)
    halves = [(statistics.median(times[True][part]) - statistics.median(times[False][part])) * 1e3 / added_ms
              for part in (slice(0, half), slice(half if rounds > 1 else 0, None))]
    return {"plain_ms": plain, "burned_ms": burned, "burn_ms": added_ms, "slope": (burned - plain) / added_ms,
            "slope_halves": halves}


def worker(args):
    quiet_device_probe()
    use_inline_cpu_device(omp_spin=True)
    out = added_python(args.model, args.rounds, args.added_ms)
    out.update(tiny_input(args.model, args.tiny_steps))
    print("@@host " + json.dumps(out), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--rounds", type=int, default=12, help="step pairs (plain, with added Python) per model")
    ap.add_argument("--added-ms", type=float, default=100.0,
                    help="main-thread CPU added per step, split over the convs")
    ap.add_argument("--tiny-steps", type=int, default=30)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    add_results_argument(ap)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    print(f"{'model':10s} {'thr':>3s} {'calls/step':>10s} {'Python ms':>9s} {'step ms':>8s} {'+added':>8s} "
          f"{'added ms':>8s} {'slope':>6s} {'Python cost ms':>14s}")
    measured = []
    for model in args.models:
        for threads in args.threads:
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--model", model, "--rounds",
                   str(args.rounds), "--added-ms", str(args.added_ms), "--tiny-steps", str(args.tiny_steps)]
            proc = subprocess.run(cmd, env=thread_env(threads), capture_output=True, text=True, check=True)
            line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("@@host "))
            r = json.loads(line[len("@@host "):])
            print(f"{model:10s} {threads:3d} {r['calls']:10.0f} {r['cpu_ms']:9.1f} {r['plain_ms']:8.1f} "
                  f"{r['burned_ms']:8.1f} {r['burn_ms']:8.1f} {r['slope']:6.2f} {r['slope'] * r['cpu_ms']:14.1f}",
                  flush=True)
            measured.append((model, threads, r))
    save_run(args.results, "benchmarks/bench_host_overhead.py", "host", args.threads, results_figures(measured),
             "what the Python thread costs a step: a busy loop before every conv, steps with and without it "
             "alternating (slope: extra step time per ms of Python)",
             conditions=f"tiny input (2×C×32²) for the Python ms; {args.rounds} step pairs, "
                        f"+{args.added_ms:g} ms of Python")


def results_figures(measured):
    """results/host_overhead.json's layout from [(model, threads, a worker's figures)]: per_model rows, and per
    thread count T, slope_T_threads ({min, max} over the models) and cost_share_T_threads ({model: {v, min,
    max}}: the slope times the tiny input's Python ms, over the step's ms)."""
    figures = {"per_model": []}
    for model, threads, r in measured:
        figures["per_model"].append({"model": model, "threads": threads, "Python calls / step": round(r["calls"]),
                                     "Python ms": round(r["cpu_ms"], 1), "step ms": round(r["plain_ms"]),
                                     f"+ {r['burn_ms']:g} ms of Python": round(r["burned_ms"]),
                                     "slope": round(r["slope"], 2), "cost, ms": round(r["slope"] * r["cpu_ms"], 1)})
        shares = [slope * r["cpu_ms"] / r["plain_ms"] for slope in [r["slope"]] + r["slope_halves"]]
        figures.setdefault(f"cost_share_{threads}_threads", {})[model] = {
            "v": round(shares[0], 3), "min": round(min(shares[1:]), 3), "max": round(max(shares[1:]), 3)}
    for threads in sorted({t for _, t, _ in measured}):
        slopes = [r["slope"] for _, t, r in measured if t == threads]
        figures[f"slope_{threads}_threads"] = {"min": round(min(slopes), 2), "max": round(max(slopes), 2)}
    return figures


if __name__ == "__main__":
    main()
