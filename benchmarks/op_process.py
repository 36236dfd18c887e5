"""One framework's op timed in a fresh process, for the op benchmarks (bench_max_pool.py, bench_linear.py).

The worker's code defines ``step()`` (one forward + backward call) after the benchmark's setup; :data:`TIMING`
warms it up, times ``reps`` calls and prints the median ms after ``@@``. Each framework gets its own process so
that none inherits another's threads or allocator state.
"""
import json
import os
import statistics
import subprocess

from bench_train_step import thread_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TIMING = r'''
for _ in range(3):
    step()
times = []
for _ in range(reps):
    t0 = time.perf_counter()
    step()
    times.append((time.perf_counter() - t0) * 1e3)
print("@@" + json.dumps(sorted(times)[len(times) // 2]))
'''


def median_ms(python, code, args, threads, name, with_repo=True):
    """Median ms of ``reps`` calls of ``code``'s ``step()`` in a new ``python`` process with ``threads`` threads
    (`thread_env`), ``args`` as its sys.argv[1:]; ``with_repo``: this checkout on its PYTHONPATH (basebn)."""
    env = thread_env(threads)
    if with_repo:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    res = subprocess.run([python, "-c", code + TIMING, *args], env=env, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"{name} worker failed:\n{res.stderr[-2000:]}")
    return json.loads(next(line for line in res.stdout.splitlines() if line.startswith("@@"))[2:])


def alternating_medians(pythons, codes, shape, threads, rounds, reps):
    """{framework: median over ``rounds`` of :func:`median_ms`} for the frameworks of ``codes`` (name -> worker
    code, run by ``pythons[name]`` with argv ``shape reps threads``), the order alternating A B C, C B A, ..."""
    names = list(codes)
    times = {fw: [] for fw in names}
    for r in range(rounds):
        for fw in (names if r % 2 == 0 else names[::-1]):
            times[fw].append(median_ms(pythons[fw], codes[fw], (shape, str(reps), str(threads)), threads, fw,
                                       with_repo=fw != "torch"))
    return {fw: statistics.median(t) for fw, t in times.items()}
