"""One rank of the multi-process SyncBatchNorm test; run by tests/test_sync_bn.py under mpiexec.

Usage: mpiexec -n K python -m tests.workers.mpi_sync_bn_worker DIR

Reads DIR/in.npz (the GLOBAL batches and the per-rank batch sizes), takes this rank's slice, runs
two training steps of two SyncBatchNorm layers (a: 4D input, momentum 0.9; b: 2D input,
momentum=None) plus one eval forward, and writes DIR/out_<rank>.npz with outputs, input grads,
parameter grads, running stats and collective counts. The test compares them with numpy.
"""
import os
import sys

import numpy as np

import megengine as mge
from megengine.autodiff import GradManager

from basebn import distributed as dist
from basebn.layers.sync_bn import SyncBatchNorm


def _set(param, value):
    param[...] = mge.tensor(value.reshape(param.shape).astype(np.float32))


def main(out_dir):
    backend = dist.init("auto")
    rank, world = dist.get_rank(), dist.get_world_size()
    inp = np.load(os.path.join(out_dir, "in.npz"))
    sizes = [int(s) for s in inp["sizes"]]
    assert len(sizes) == world, (sizes, world)
    lo, hi = sum(sizes[:rank]), sum(sizes[:rank + 1])

    bn_a = SyncBatchNorm(inp["wa"].size, eps=float(inp["eps"]), momentum=float(inp["momentum"]))
    bn_b = SyncBatchNorm(inp["wb"].size, eps=float(inp["eps"]), momentum=None)
    for bn, w, b in ((bn_a, inp["wa"], inp["ba"]), (bn_b, inp["wb"], inp["bb"])):
        _set(bn.weight, w)
        _set(bn.bias, b)
    params = list(bn_a.parameters()) + list(bn_b.parameters())

    out = {"backend": np.array(backend), "world": np.array(world), "rank": np.array(rank)}
    for step in range(2):
        xa = mge.tensor(inp[f"xa{step}"][lo:hi])
        xb = mge.tensor(inp[f"xb{step}"][lo:hi])
        ga = mge.tensor(inp[f"ga{step}"][lo:hi])
        gb = mge.tensor(inp[f"gb{step}"][lo:hi])
        gm = GradManager().attach(params + [xa, xb])
        with dist.count_collectives() as counter:
            with gm:
                ya, yb = bn_a(xa), bn_b(xb)
                fwd = counter.as_dict()
                gm.backward((ya * ga).sum() + (yb * gb).sum())
        total = counter.as_dict()
        out[f"fwd_counts{step}"] = np.array([fwd["all_gather"], fwd["all_reduce_sum"], fwd["broadcast"]])
        out[f"bwd_counts{step}"] = np.array([total[k] - fwd[k] for k in ("all_gather", "all_reduce_sum", "broadcast")])
        for name, bn, y, x in (("a", bn_a, ya, xa), ("b", bn_b, yb, xb)):
            out[f"y{name}{step}"] = y.numpy()
            out[f"dx{name}{step}"] = x.grad.numpy()
            out[f"dw{name}{step}"] = bn.weight.grad.numpy().reshape(-1)
            out[f"db{name}{step}"] = bn.bias.grad.numpy().reshape(-1)
            out[f"rm{name}{step}"] = bn.running_mean.numpy().reshape(-1)
            out[f"rv{name}{step}"] = bn.running_var.numpy().reshape(-1)
        for p in params:
            p.grad = None

    bn_a.eval()
    with dist.count_collectives() as counter:
        out["ya_eval"] = bn_a(mge.tensor(inp["xa_eval"][lo:hi])).numpy()
    out["eval_counts"] = np.array(counter.total)

    np.savez(os.path.join(out_dir, f"out_{rank}.npz"), **out)
    dist.barrier()


if __name__ == "__main__":
    main(sys.argv[1])
