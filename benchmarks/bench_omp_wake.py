"""How late libgomp's OpenMP worker starts a parallel region after the master thread was busy alone for a while:
the cost behind basebn's OpenMP spin setting (results/omp_spin.json).

    python benchmarks/bench_omp_wake.py [--gaps-us 10 100 1000 5000] [--reps 200]

Compiles a small C++ probe with g++ -fopenmp (the same libgomp family as basebn's oneDNN build) and runs it with
OMP_WAIT_POLICY=PASSIVE (basebn's default outside basebn.train), GOMP_SPINCOUNT=30000 (basebn.train's) and
libgomp's default, side by side: per gap, the median / 90th percentile / max microseconds from the region's start
until the worker runs. 2 threads; needs g++. ``--results FILE`` (results/omp_spin.json) appends the
medians (``wake_latency_us_after_gap``), the 90th percentiles and the maxima, per setting in gap order.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

from results_file import add_results_argument, save_run

PROBE = r"""
#include <omp.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
using clk = std::chrono::steady_clock;
static double us_since(clk::time_point t) { return std::chrono::duration<double, std::micro>(clk::now() - t).count(); }
int main(int argc, char** argv) {
    const int gap_us = std::atoi(argv[1]), reps = std::atoi(argv[2]);
    std::vector<double> late;
    for (int it = 0; it < reps; ++it) {
        const auto busy = clk::now();
        while (us_since(busy) < gap_us) {
        }
        const auto start = clk::now();
        double worker = 0;
#pragma omp parallel num_threads(2)
        {
            if (omp_get_thread_num() == 1) {
                worker = us_since(start);
            }
        }
        late.push_back(worker);
    }
    std::sort(late.begin(), late.end());
    std::printf("%.1f %.1f %.1f\n", late[late.size() / 2], late[late.size() * 9 / 10], late.back());
}
"""

SETTINGS = {
    "PASSIVE": {"OMP_WAIT_POLICY": "PASSIVE"},
    "GOMP_SPINCOUNT=30000": {"GOMP_SPINCOUNT": "30000"},
    "libgomp default": {},
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gaps-us", nargs="+", type=int, default=[10, 100, 1000, 5000])
    ap.add_argument("--reps", type=int, default=200)
    add_results_argument(ap)
    args = ap.parse_args()
    gaps = [f"{g} us" if g < 1000 else f"{g / 1000:g} ms" for g in args.gaps_us]
    figures = {key: {"gaps": gaps} for key in ("wake_latency_us_after_gap", "p90_us", "max_us")}
    if shutil.which("g++") is None:
        print("error: needs g++ (apt-get install g++)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = os.path.join(tmp, "probe.cpp"), os.path.join(tmp, "probe")
        with open(src, "w") as f:
            f.write(PROBE)
        subprocess.run(["g++", "-O2", "-fopenmp", src, "-o", exe], check=True)
        base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
        print(f"{'gap (us)':>9s} " + " ".join(f"{name + ' med/p90/max':>34s}" for name in SETTINGS))
        for gap in args.gaps_us:
            cells = []
            for name, extra in SETTINGS.items():
                out = subprocess.run([exe, str(gap), str(args.reps)], env=dict(base, **extra), capture_output=True,
                                     text=True, check=True).stdout.split()
                cells.append("/".join(out).rjust(34))
                for key, value in zip(figures, out):
                    figures[key].setdefault(name, []).append(float(value))
            print(f"{gap:9d} " + " ".join(cells), flush=True)
    save_run(args.results, "benchmarks/bench_omp_wake.py", "wake", [2], figures,
             "the OpenMP worker's spin with the inline device: wake-up latency and training steps",
             conditions=f"{args.reps} regions per gap and setting")
    return 0


if __name__ == "__main__":
    sys.exit(main())
