"""One rank of the basebn.distributed primitives test; run by tests/distributed/test_distributed.py under mpiexec.

Usage: mpiexec -n K python -m tests.workers.mpi_dist_worker DIR    -> DIR/out_<rank>.pkl
"""
import os
import pickle
import sys

import numpy as np


def main(out_dir):
    import basebn.distributed as dist

    res = {"mpi4py_before_init": "mpi4py" in sys.modules}
    res["backend"] = dist.init("auto")
    res["init_again"] = dist.init("auto")
    res["mpi4py_after_init"] = "mpi4py" in sys.modules
    rank, world = dist.get_rank(), dist.get_world_size()
    res.update(rank=rank, world=world, main=dist.is_main_process())

    import megengine as mge

    with dist.count_collectives() as counter:
        t = mge.tensor((np.arange(6, dtype=np.float32) + 10 * rank).reshape(2, 3))
        s = dist.all_reduce_sum(t)
        res["ar_f32"] = (type(s).__name__, s.numpy(), str(s.dtype), tuple(s.shape))
        ti = mge.tensor(np.array([rank + 1, 2 * rank], dtype=np.int32))
        si = dist.all_reduce_sum(ti)
        res["ar_i32"] = (si.numpy(), str(si.dtype))
        a64 = dist.all_reduce_sum(np.array([0.1 * (rank + 1), 1.0 + 1e-12 * (rank + 1)], dtype=np.float64))
        res["ar_np64"] = (type(a64).__name__, a64, a64.dtype.str)
        a16 = dist.all_reduce_sum(np.array([0.5, rank], dtype=np.float16))
        res["ar_np16"] = (a16, a16.dtype.str)
        g = dist.all_gather(mge.tensor(np.full((2, 2), rank, dtype=np.float32)))
        res["ag"] = (g.numpy(), tuple(g.shape))
        g0 = dist.all_gather(mge.tensor(np.float32(rank + 0.5)))
        res["ag_scalar"] = g0.numpy()
        src = world - 1
        b = dist.broadcast(mge.tensor(np.arange(3, dtype=np.float32) * (rank + 1)), src=src)
        res["bc"] = b.numpy()
        res["bc_np"] = dist.broadcast(np.array([rank, rank], dtype=np.int64), src=0)
    res["counts"] = counter.as_dict()
    dist.barrier()
    with open(os.path.join(out_dir, f"out_{rank}.pkl"), "wb") as f:
        pickle.dump(res, f)


if __name__ == "__main__":
    main(sys.argv[1])
