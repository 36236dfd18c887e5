"""MegEngine's event poller at normal vs lowest priority: training steps A/B in one process.

    .venv/bin/python benchmarks/bench_event_poller.py [--models resnet20 resnet18 mbnetv2] [--threads 2] [--pairs 12]

MegEngine's imperative runtime keeps a thread ("CompNodeSync") that wakes every 10 microseconds for the life of
the process; basebn's CLIs give it nice 19 (basebn.utils.cpu_runtime.lower_event_poller_priority). Each model
runs in one process started as basebn.train starts (bench_train_step's ``basebn`` runner: tuned CPU runtime,
inline CPU device) with the poller left alone; then the steps alternate, pair by pair (A B, B A, ...), between the
poller at nice 0 and at nice 19, so machine load drifts over both alike. Setting nice 0 again after 19 needs
permission to raise a priority (root or CAP_SYS_NICE). Prints the poller's wakes per second (from its context
switches), each setting's median / min step ms and their ratio. ``--results FILE`` (results/event_poller.json)
appends them; ``nice19_over_nice0`` holds the first thread count's ratios.
"""
import argparse
import os
import statistics
import subprocess
import sys

from results_file import add_results_argument, save_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

WORKER = r'''
import os, statistics, sys, time
sys.path.insert(0, sys.argv[1])
os.environ["BASEBN_TUNE_CPU"] = "0"  # this benchmark sets the poller's priority itself: import basebn leaves it
import benchmarks.bench_train_step as bench
from basebn.utils.cpu_runtime import EVENT_POLLER_THREAD
bench.tune_cpu_runtime()
bench.quiet_device_probe(tune=False)
bench.use_inline_cpu_device(omp_spin=True)
runner = bench.MegEngineRunner("basebn", sys.argv[2], None)
tids = [int(t) for t in os.listdir("/proc/self/task")
        if open(f"/proc/self/task/{t}/comm").read().strip() == EVENT_POLLER_THREAD]
assert tids, "no MegEngine event poller thread in this process"
def switches():
    status = open(f"/proc/self/task/{tids[0]}/status").read().split("\n")
    return sum(int(l.split()[1]) for l in status if "ctxt_switches:" in l)
for _ in range(2):
    runner.step()
c0, t0 = switches(), time.perf_counter()
time.sleep(1.0)
wakes = (switches() - c0) / (time.perf_counter() - t0)
times = {0: [], 19: []}
for i in range(int(sys.argv[3])):
    for nice in ((0, 19) if i % 2 == 0 else (19, 0)):
        try:
            os.setpriority(os.PRIO_PROCESS, tids[0], nice)
        except PermissionError:
            sys.exit("setting nice 0 again after 19 needs root or CAP_SYS_NICE")
        times[nice].append(runner.step())
med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
low = {k: min(v) * 1e3 for k, v in times.items()}
print(f"@@ {wakes:.0f} {med[0]:.0f} {low[0]:.0f} {med[19]:.0f} {low[19]:.0f}")
'''


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["resnet20", "resnet18", "mbnetv2"])
    ap.add_argument("--threads", nargs="+", type=int, default=[2])
    ap.add_argument("--pairs", type=int, default=12, help="step pairs (nice 0, nice 19) per model")
    add_results_argument(ap)
    args = ap.parse_args()
    figures = {"ms_median_min_nice0_to_nice19": {}, "nice19_over_nice0_by_threads": {}, "nice19_over_nice0": {}}
    wakes_seen = []
    print(f"{'model':9s} {'thr':>3s} {'poller wakes/s':>15s} {'nice 0 med/min':>16s} {'nice 19 med/min':>16s} "
          f"{'19/0':>6s}")
    for threads in args.threads:
        t = str(threads)
        env = dict(os.environ, OMP_NUM_THREADS=t, MKL_NUM_THREADS=t, OPENBLAS_NUM_THREADS=t, BASEBN_NUM_THREADS=t)
        for model in args.models:
            out = subprocess.run([sys.executable, "-c", WORKER, ROOT, model, str(args.pairs)], env=env,
                                 capture_output=True, text=True)
            line = [l for l in out.stdout.splitlines() if l.startswith("@@ ")]
            if out.returncode != 0 or not line:
                print(f"{model:9s} {threads:3d} failed: {(out.stderr.strip().splitlines() or ['?'])[-1]}")
                continue
            wakes, med0, min0, med19, min19 = (float(v) for v in line[0].split()[1:])
            print(f"{model:9s} {threads:3d} {wakes:15.0f} {f'{med0:.0f}/{min0:.0f}':>16s} "
                  f"{f'{med19:.0f}/{min19:.0f}':>16s} {med19 / med0:5.2f}x", flush=True)
            ratio = round(med19 / med0, 3)
            figures["ms_median_min_nice0_to_nice19"].setdefault(model, {})[t] = [[med0, min0], [med19, min19]]
            figures["nice19_over_nice0_by_threads"].setdefault(t, {})[model] = ratio
            if threads == args.threads[0]:
                figures["nice19_over_nice0"][model] = ratio
            wakes_seen.append(wakes)
    if wakes_seen:
        figures["wakes_per_s"] = {"min": min(wakes_seen), "max": max(wakes_seen)}
    save_run(args.results, "benchmarks/bench_event_poller.py", "poller", args.threads, figures,
             "MegEngine's 10-µs event poller at nice 19 vs nice 0, steps alternating in one process",
             conditions=f"{args.pairs} step pairs alternating the poller at nice 0 and 19")


if __name__ == "__main__":
    main()
