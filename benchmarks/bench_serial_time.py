"""Where a multi-threaded basebn training step runs on one core: `perf` samples of the OpenMP threads, matched in time.

    .venv/bin/python benchmarks/bench_serial_time.py [--models mbnetv2] [--threads 2] [--seconds 4] [--freq 999]
        [--detail N]

Per model, a process started as basebn.train starts (bench_train_step's ``basebn`` runner) runs steps while
``perf record`` samples it (needs perf and permission to attach: root, or kernel.perf_event_paranoid <= 1;
``ONEDNN_JIT_PROFILE=2`` names oneDNN's JIT kernels). MegEngine runs its kernels and basebn's ops on its worker
thread, which is the OpenMP master; the other compute thread is an OpenMP worker. Each sample of the master is
classed by the OpenMP worker's nearest sample (within half a sampling period): the worker computing (both
busy), waiting in libgomp (the master runs alone: serial time, by what it runs), off the CPU (preempted by the
Python thread or the event poller, or asleep after its spin), or the master itself waiting in libgomp while the
worker computes (imbalance at a region's end). Printed in ms per step: the serial time by what
the master runs (MegEngine's dispatch and its own kernels, the C library's malloc / free, basebn's code, oneDNN),
the master waiting at a region's end for a worker that computes (imbalance) or is off the CPU (preempted), the
master's own time off the CPU (step time minus its samples), and the CPU time of the Python thread and of
MegEngine's event poller, which compete with the compute threads for the cores. Sampling makes it approximate: a
region shorter than the sampling period can be counted as serial at its start. ``--results FILE``
(results/serial_time.json) appends the ms per step and two shares of the step per model: the master alone
(serial time) and a compute thread off the CPU.
"""
import argparse
import bisect
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from results_file import add_results_argument, save_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MASTER_OFF = "master off the CPU (waits for Python's next op, or preempted)"
# the rows in which one of the two compute threads is off the CPU while the step runs
OFF_CPU_ROWS = ("master computes, worker off the CPU (preempted, or asleep after its spin)",
                "master waits, worker off the CPU (preempted or asleep)", MASTER_OFF)

WORKER = r'''
import os, sys, time
sys.path.insert(0, sys.argv[1])
import benchmarks.bench_train_step as bench
bench.quiet_device_probe()
bench.use_inline_cpu_device(omp_spin=True)
runner = bench.MegEngineRunner("basebn", sys.argv[2], None)
for _ in range(3):
    runner.step()
ready, stop = sys.argv[3], sys.argv[4]
open(ready, "w").close()
times = []
while not os.path.exists(stop):
    times.append(runner.step())
times.sort()
print(f"@@ {1e3 * times[len(times) // 2]:.1f}")
'''

SAMPLE = re.compile(r"\s*(\S+)\s+(\d+)\s+([\d.]+):\s+[0-9a-f]+\s+(.*?)\s+\((.*)\)\s*$")


def category(dso, sym):
    """What the master runs, in a few classes."""
    name = os.path.basename(dso)
    if name.startswith("perf-"):
        return "oneDNN JIT kernels"
    if "libmegengine" in name or "_imperative_rt" in name:
        return "MegEngine dispatch and own kernels"
    if name.startswith("libc.so") and re.search(r"malloc|free|unlink|memalign|consolidate", sym):
        return "malloc / free"
    if "basebn_bn" in name:
        return "basebn ops (kernels and their serial parts)"
    if "libdnnl" in name:
        return "oneDNN library code"
    return "other (" + name[:24] + ")"


def read_samples(perf_data):
    out = subprocess.run(["perf", "script", "-i", perf_data, "-F", "comm,tid,time,ip,sym,dso"],
                         capture_output=True, text=True, check=True).stdout
    threads = collections.defaultdict(list)
    comms = {}
    for line in out.splitlines():
        m = SAMPLE.match(line)
        if m:
            comm, tid = m.group(1), int(m.group(2))
            comms[tid] = comm
            threads[tid].append((float(m.group(3)), m.group(5), m.group(4)))
    return threads, comms


def analyse(threads, comms, steps, freq):
    """ms per step of each class (see the module doc)."""
    per_sample = 1e3 / freq / steps
    workers = sorted((t for t, c in comms.items() if c == "worker"), key=lambda t: -len(threads[t]))[:2]
    if len(workers) < 2:
        raise SystemExit("fewer than two compute threads sampled: run with --threads 2 or more")

    def megengine_share(t):
        return sum(1 for _, dso, _ in threads[t] if "libmegengine" in dso or "_imperative_rt" in dso)

    master, omp = sorted(workers, key=megengine_share, reverse=True)
    times = [s[0] for s in threads[omp]]
    window = 0.5 / freq

    def omp_state(t):
        i = bisect.bisect_left(times, t)
        best = min((j for j in (i - 1, i) if 0 <= j < len(times)), key=lambda j: abs(times[j] - t), default=None)
        if best is None or abs(times[best] - t) > window:
            return "off"
        return "wait" if "libgomp" in threads[omp][best][1] else "busy"

    rows, symbols = collections.Counter(), collections.Counter()
    for t, dso, sym in threads[master]:
        state = omp_state(t)
        if "libgomp" in dso:
            rows[{"busy": "master waits, worker computes (imbalance)",
                  "off": "master waits, worker off the CPU (preempted or asleep)",
                  "wait": "master and worker wait in libgomp"}[state]] += 1
        elif state == "busy":
            rows["both compute"] += 1
        elif state == "off":
            rows["master computes, worker off the CPU (preempted, or asleep after its spin)"] += 1
        else:
            rows["serial: " + category(dso, sym)] += 1
            symbols[re.sub(r"\(.*", "", sym)[:70] + " [" + os.path.basename(dso)[:20] + "]"] += 1
    for tid, comm in comms.items():
        if comm in ("interpreter", "CompNodeSync"):
            rows[("Python thread" if comm == "interpreter" else "event poller") + " CPU"] += len(threads[tid])
    return ({k: v * per_sample for k, v in rows.items()},
            [(name, n * per_sample) for name, n in symbols.most_common()])


def run_model(model, threads, seconds, freq):
    tmp = tempfile.mkdtemp(prefix="bench_serial_")
    ready, stop, data = (os.path.join(tmp, n) for n in ("ready", "stop", "perf.data"))
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), BASEBN_NUM_THREADS=str(threads), ONEDNN_JIT_PROFILE="2")
    proc = subprocess.Popen([sys.executable, "-c", WORKER, ROOT, model, ready, stop], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        while not os.path.exists(ready):
            if proc.poll() is not None:
                raise SystemExit(f"{model}: the runner process exited ({proc.returncode})")
            time.sleep(0.1)
        rec = subprocess.run(["perf", "record", "-q", "-F", str(freq), "-p", str(proc.pid), "-o", data, "--",
                              "sleep", str(seconds)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if rec.returncode != 0:
            raise SystemExit(f"perf record failed ({rec.stderr.strip().splitlines()[-1:]}): run as root or set "
                             "kernel.perf_event_paranoid to 1 or less")
        samples, comms = read_samples(data)
    finally:
        open(stop, "w").close()
        out, _ = proc.communicate(timeout=120)
        shutil.rmtree(tmp, ignore_errors=True)
    median_ms = float(out.split("@@")[-1])
    steps_in_window = seconds * 1e3 / median_ms
    return (median_ms,) + analyse(samples, comms, steps_in_window, freq)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["mbnetv2"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--freq", type=int, default=999)
    ap.add_argument("--detail", type=int, default=0, help="also list the N symbols with most serial time")
    add_results_argument(ap)
    args = ap.parse_args()
    figures = {"step_ms": {}, "ms_per_step": {}, "master_alone_share": {}, "thread_off_cpu_share": {}}
    if shutil.which("perf") is None:
        raise SystemExit("perf is not installed (apt-get install linux-perf)")
    for model in args.models:
        step_ms, rows, symbols = run_model(model, args.threads, args.seconds, args.freq)
        master_on = sum(ms for name, ms in rows.items() if not name.endswith(" CPU"))
        rows[MASTER_OFF] = max(0.0, step_ms - master_on)
        print(f"\n{model}, {args.threads} threads: step median {step_ms:.1f} ms; ms per step (approximate):")
        for name, ms in sorted(rows.items(), key=lambda kv: -kv[1]):
            print(f"  {name:58} {ms:7.1f}")
        if args.detail:
            print("  serial time by symbol:")
            for name, ms in symbols[:args.detail]:
                print(f"    {name:96} {ms:6.2f}")
        for key, value in model_figures(step_ms, rows).items():
            figures[key][model] = value
    save_run(args.results, "benchmarks/bench_serial_time.py", "serial", [args.threads], figures,
             "where the second core waits: perf samples of both OpenMP threads, matched in time (2 threads)",
             conditions=f"perf at {args.freq} Hz over {args.seconds:g} s per model")


def model_figures(step_ms, rows):
    """One model's figures: the step's median ms, the ms per step of each row, the share of the step the master
    runs alone (every "serial: " row) and the share a compute thread is off the CPU (OFF_CPU_ROWS)."""
    return {"step_ms": round(step_ms, 1), "ms_per_step": {k: round(v, 2) for k, v in rows.items()},
            "master_alone_share": round(sum(v for k, v in rows.items() if k.startswith("serial: ")) / step_ms, 3),
            "thread_off_cpu_share": round(sum(rows.get(k, 0.0) for k in OFF_CPU_ROWS) / step_ms, 3)}


if __name__ == "__main__":
    main()
