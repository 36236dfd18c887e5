"""One rank of the sync_bn_buffers test; run by tests/distributed/test_bn_buffers.py under mpiexec.

Usage: mpiexec -n K python -m tests.workers.mpi_bn_buffers_worker DIR MODE -> DIR/out_<rank>.pkl
Each rank's BN buffers are made from its rank (so they differ); the FrozenBatchNorm2d's too.
"""
import os
import pickle
import sys

import numpy as np


def rank_buffers(rank):
    """The buffers rank `rank` starts from: {layer: (running_mean, running_var)} as float32 (C,) arrays."""
    rng = np.random.RandomState(100 + rank)
    return {name: (rng.randn(c).astype(np.float32), rng.uniform(0.5, 2.0, c).astype(np.float32))
            for name, c in (("bn", 3), ("sync", 2), ("brn", 4), ("frozen", 2))}


def main(out_dir, mode):
    import megengine as mge
    import megengine.module as M

    import basebn.distributed as dist
    from basebn.layers import BatchNorm2d, BatchRenorm2d, FrozenBatchNorm2d, SyncBatchNorm

    dist.init("auto")
    rank = dist.get_rank()
    model = M.Sequential(BatchNorm2d(3), SyncBatchNorm(2), BatchRenorm2d(4), FrozenBatchNorm2d(2))
    for m, (mean, var) in zip(model, rank_buffers(rank).values()):
        m.running_mean[...] = mge.tensor(mean.reshape(1, -1, 1, 1))
        m.running_var[...] = mge.tensor(var.reshape(1, -1, 1, 1))
    with dist.count_collectives() as counter:
        n = dist.sync_bn_buffers(model, mode)
    out = {"set": n, "collectives": counter.as_dict(),
           "buffers": {name: (m.running_mean.numpy().ravel(), m.running_var.numpy().ravel())
                       for name, m in zip(("bn", "sync", "brn", "frozen"), model)}}
    with open(os.path.join(out_dir, f"out_{rank}.pkl"), "wb") as f:
        pickle.dump(out, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
