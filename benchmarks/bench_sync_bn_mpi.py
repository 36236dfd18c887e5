"""SyncBatchNorm overhead on CPU over MPI: a training step of a small ResNet-like net.

    python benchmarks/bench_sync_bn_mpi.py [--nprocs 2] [--batch 64 16] [--size 32 16] [--steps 30]
        [--results results/sync_bn_mpi.json]

relaunches itself under ``mpiexec -n NPROCS`` (or run it under mpiexec directly). Each rank runs
forward + backward + gradient all-reduce (one packed ``basebn.distributed.all_reduce_sum``, like the
trainer) + SGD step on its own batch, for three norm layers:

* ``bn``          megengine.module.BatchNorm2d, local statistics;
* ``syncbn_self`` basebn SyncBatchNorm with ``group=MPI.COMM_SELF``: the same code path as SyncBN
  (bn_ops, the packed buffers, the numpy round trip) but no cross-rank traffic;
* ``syncbn``      basebn SyncBatchNorm over all ranks.

Each (batch, size) pair of ``--batch`` / ``--size`` is one configuration, measured in turn. Prints the median
step time of each (rank 0's clock; every step starts after a barrier) and the overhead ratios syncbn / bn and
syncbn / syncbn_self. ``--json PATH`` also writes them (a list, one entry per configuration). ``--results FILE``
(results/sync_bn_mpi.json) appends them: ``syncbn_over_local`` (syncbn / bn) of the configuration with the most
values per rank, ``syncbn_over_local_latency_bound`` of the one with the fewest (small batches, where the
per-layer collectives' latency dominates), given two or more.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

from results_file import add_results_argument, save_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nprocs", type=int, default=2)
    p.add_argument("--batch", type=int, nargs="+", default=[64, 16], help="images per rank, per configuration")
    p.add_argument("--size", type=int, nargs="+", default=[32, 16], help="image height = width, per configuration")
    p.add_argument("--width", type=int, default=16, help="channels of the first stage")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--json", default=None)
    add_results_argument(p)
    args = p.parse_args(argv)
    if len(args.batch) != len(args.size):
        p.error(f"--batch has {len(args.batch)} values and --size {len(args.size)}: give one size per batch")
    return args


def relaunch(args):
    from basebn.distributed import mpi_world_size_from_env

    if mpi_world_size_from_env() > 0:
        return False
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if not os.access(mpiexec, os.X_OK):
        import shutil

        mpiexec = shutil.which("mpiexec")
    if mpiexec is None:
        sys.exit("mpiexec not found (pip install mpi4py mpich)")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.setdefault("OMP_NUM_THREADS", "1")
    cmd = [mpiexec, "-n", str(args.nprocs), sys.executable, os.path.abspath(__file__)] + sys.argv[1:]
    sys.exit(subprocess.call(cmd, env=env))


def build_net(norm, width):
    import megengine.functional as F
    import megengine.module as M

    class Block(M.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = M.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = norm(cout)
            self.conv2 = M.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = norm(cout)
            self.short = None
            if stride != 1 or cin != cout:
                self.short = M.Sequential(M.Conv2d(cin, cout, 1, stride, bias=False), norm(cout))

        def forward(self, x):
            y = F.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            return F.relu(y + (x if self.short is None else self.short(x)))

    class Net(M.Module):
        def __init__(self):
            super().__init__()
            self.stem = M.Sequential(M.Conv2d(3, width, 3, 1, 1, bias=False), norm(width), M.ReLU())
            self.blocks = M.Sequential(Block(width, width, 1), Block(width, 2 * width, 2),
                                       Block(2 * width, 4 * width, 2))
            self.fc = M.Linear(4 * width, 10)

        def forward(self, x):
            return self.fc(F.mean(self.blocks(self.stem(x)), axis=(2, 3)))

    return Net()


def bench(kind, args, batch, size, dist, rank):
    import megengine as mge
    import megengine.functional as F
    import megengine.module as M
    import megengine.optimizer as optim
    from megengine.autodiff import GradManager

    from basebn.layers.sync_bn import SyncBatchNorm

    if kind == "bn":
        norm = M.BatchNorm2d
    elif kind == "syncbn_self":
        from mpi4py import MPI

        def norm(c):
            return SyncBatchNorm(c, group=MPI.COMM_SELF)
    else:
        norm = SyncBatchNorm
    mge.random.seed(0)
    net = build_net(norm, args.width)
    for p in net.parameters():  # same initial weights on every rank
        p._reset(dist.broadcast(p, src=0))
    params = list(net.parameters())
    opt = optim.SGD(params, lr=0.01, momentum=0.9)
    gm = GradManager().attach(params)
    rng = np.random.RandomState(rank)
    world = dist.get_world_size()
    n_bn = sum(isinstance(m, (M.BatchNorm2d, SyncBatchNorm)) for m in net.modules())

    times, colls = [], []
    for step in range(args.warmup + args.steps):
        x = mge.tensor(rng.randn(batch, 3, size, size).astype(np.float32))
        y = mge.tensor(rng.randint(0, 10, batch).astype(np.int32))
        dist.barrier()
        t0 = time.perf_counter()
        with dist.count_collectives() as c:
            with gm:
                loss = F.nn.cross_entropy(net(x), y)
                gm.backward(loss)
            grads = [p.grad for p in params]
            flat = dist.all_reduce_sum(F.concat([g.reshape(-1) for g in grads])) / world
            off = 0
            for p, g in zip(params, grads):
                p.grad = flat[off:off + g.size].reshape(g.shape)
                off += g.size
            opt.step()
            opt.clear_grad()
            loss.numpy()  # force completion
        t1 = time.perf_counter()
        if step >= args.warmup:
            times.append(t1 - t0)
            colls.append(c.total)
    return {"median_s": float(np.median(times)), "p10_s": float(np.percentile(times, 10)),
            "p90_s": float(np.percentile(times, 90)), "collectives_per_step": int(np.median(colls)),
            "bn_layers": n_bn}


def main():
    args = parse_args()
    relaunch(args)
    from basebn import distributed as dist

    dist.init("auto")
    rank, world = dist.get_rank(), dist.get_world_size()
    configs = []
    for batch, size in zip(args.batch, args.size):
        results = {kind: bench(kind, args, batch, size, dist, rank) for kind in ("bn", "syncbn_self", "syncbn")}
        bn, local, sync = (results[k]["median_s"] for k in ("bn", "syncbn_self", "syncbn"))
        configs.append(dict(results, world=world, batch=batch, size=size, width=args.width, steps=args.steps,
                            ratio_syncbn_bn=sync / bn, ratio_syncbn_self=sync / local))
        if rank == 0:
            print(f"SyncBN over MPI: {world} ranks, backend {dist.backend()}, batch {batch}/rank, "
                  f"{size}x{size}, width {args.width}, {args.steps} steps "
                  f"({results['syncbn']['bn_layers']} BN layers)")
            for k, r in results.items():
                print(f"  {k:12s} median {1e3 * r['median_s']:8.2f} ms  (p10 {1e3 * r['p10_s']:.2f}, "
                      f"p90 {1e3 * r['p90_s']:.2f})  collectives/step {r['collectives_per_step']}")
            print(f"  overhead syncbn / bn          = {sync / bn:.3f}x")
            print(f"  overhead syncbn / syncbn_self = {sync / local:.3f}x (cross-rank traffic only)", flush=True)
    if rank == 0:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(configs, f, indent=2)
        save_run(args.results, "benchmarks/bench_sync_bn_mpi.py", "mpi",
                 [int(os.environ.get("OMP_NUM_THREADS", "1") or 1)], results_figures(configs),
                 "a SyncBN training step over 2 MPI ranks vs local BN",
                 conditions=f"{world} MPI ranks on {os.cpu_count()} cores; a small ResNet, width {args.width}")
    dist.barrier()


def results_figures(configs):
    """results/sync_bn_mpi.json's layout from the per-configuration results: ms per step of each norm per
    configuration ("BxS": batch x size), syncbn_over_local of the configuration with the most values per rank and,
    with two or more, syncbn_over_local_latency_bound of the one with the fewest."""
    def values(c):
        return c["batch"] * c["size"] ** 2

    figures = {"ms_per_step": {f"{c['batch']}x{c['size']}": {k: round(1e3 * c[k]["median_s"], 2)
                                                             for k in ("bn", "syncbn_self", "syncbn")}
                               for c in configs},
               "collectives_per_step": {f"{c['batch']}x{c['size']}": c["syncbn"]["collectives_per_step"]
                                        for c in configs}}
    figures["syncbn_over_local"] = round(max(configs, key=values)["ratio_syncbn_bn"], 3)
    if len(configs) > 1:
        figures["syncbn_over_local_latency_bound"] = round(min(configs, key=values)["ratio_syncbn_bn"], 3)
    return figures


if __name__ == "__main__":
    main()
