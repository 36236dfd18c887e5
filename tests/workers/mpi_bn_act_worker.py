"""One rank of the multi-process fused SyncBN test; run by tests/layers/test_bn_act_layers.py under mpiexec.

Usage: mpiexec -n K python -m tests.workers.mpi_bn_act_worker DIR

Reads DIR/in.npz (the GLOBAL batches, shortcuts, output gradients and the per-rank batch sizes), takes this
rank's slice, runs two training steps of one SyncBatchNormAct2d (BN + add + ReLU) and writes DIR/out_<rank>.npz
with outputs, input / shortcut / parameter grads, running stats and collective counts.
"""
import os
import sys

import numpy as np

import megengine as mge
from megengine.autodiff import GradManager

from basebn import distributed as dist
from basebn.layers import SyncBatchNormAct2d


def main(out_dir):
    dist.init("auto")
    rank = dist.get_rank()
    inp = np.load(os.path.join(out_dir, "in.npz"))
    sizes = [int(s) for s in inp["sizes"]]
    lo, hi = sum(sizes[:rank]), sum(sizes[:rank + 1])
    layer = SyncBatchNormAct2d(3, act="relu")
    layer.weight[...] = mge.tensor(inp["w"].reshape(1, 3, 1, 1).astype(np.float32))
    layer.bias[...] = mge.tensor(inp["b"].reshape(1, 3, 1, 1).astype(np.float32))
    out = {}
    for step in range(2):
        x, s = mge.tensor(inp[f"x{step}"][lo:hi]), mge.tensor(inp[f"s{step}"][lo:hi])
        gm = GradManager().attach([layer.weight, layer.bias, x, s])
        with dist.count_collectives() as counter:
            with gm:
                y = layer(x, s)
                gm.backward((y * mge.tensor(inp[f"g{step}"][lo:hi])).sum())
        counts = counter.as_dict()
        out[f"counts{step}"] = np.array([counts["all_gather"], counts["all_reduce_sum"]])
        out[f"y{step}"], out[f"dx{step}"], out[f"ds{step}"] = y.numpy(), x.grad.numpy(), s.grad.numpy()
        out[f"dw{step}"] = layer.weight.grad.numpy().reshape(-1)
        out[f"db{step}"] = layer.bias.grad.numpy().reshape(-1)
        out[f"rm{step}"] = layer.running_mean.numpy().reshape(-1)
        out[f"rv{step}"] = layer.running_var.numpy().reshape(-1)
        layer.weight.grad = layer.bias.grad = None
    np.savez(os.path.join(out_dir, f"out_{rank}.npz"), **out)
    dist.barrier()


if __name__ == "__main__":
    main(sys.argv[1])
