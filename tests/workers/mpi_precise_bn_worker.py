"""One rank of the multi-process precise BN test; run by tests/test_precise_bn.py under mpiexec.

Usage: mpiexec -n 2 python -m tests.workers.mpi_precise_bn_worker DIR

Reads DIR/in.npz (the weights of a conv -> BN -> ReLU -> conv -> BN net and every rank's batches
for each scenario), runs update_bn_stats / collect_bn_population_stats, and writes
DIR/out_<rank>.npz with the resulting statistics, summaries and collective counts. The test
compares them across ranks and with a single process. Also imported by the test for ``TwoBN``.
"""
import os
import sys

import numpy as np

import megengine as mge
import megengine.functional as F
import megengine.module as M

from basebn import distributed as dist
from basebn.layers.frozen_bn import FrozenBatchNorm2d
from basebn.layers.precise_bn import collect_bn_population_stats, update_bn_stats
from basebn.layers.sync_bn import SyncBatchNorm

# scenario -> (bn1 kind, bn2 kind, sync_bn mode, num_samples)
SCENARIOS = {
    "local": ("BN", "SyncBN", "local", 10_000),    # uneven batch counts with a SyncBN: must not hang
    "global": ("SyncBN", "SyncBN", "auto", 10_000),  # auto -> global: lockstep, global-batch features
    "quota": ("BN", "BN", "auto", 9),              # per-rank quotas 5 + 4, rank 0 cuts a batch
    "empty": ("BN", "SyncBN", "local", 10_000),    # rank 1 has no data at all
}


def _norm(kind, c):
    if kind == "SyncBN":
        return SyncBatchNorm(c)
    if kind == "FrozenBN":
        return FrozenBatchNorm2d(c)
    return M.BatchNorm2d(c)


class TwoBN(M.Module):
    """conv3x3 (bias) -> BN -> ReLU -> conv1x1 -> BN [-> GroupNorm]."""

    def __init__(self, cin=2, c1=3, c2=4, bn1="BN", bn2="BN", with_gn=False):
        super().__init__()
        self.conv1 = M.Conv2d(cin, c1, 3, padding=1, bias=True)
        self.bn1 = _norm(bn1, c1)
        self.conv2 = M.Conv2d(c1, c2, 1, bias=False)
        self.bn2 = _norm(bn2, c2)
        self.gn = M.GroupNorm(2, c2) if with_gn else None

    def forward(self, x):
        x = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return self.gn(x) if self.gn is not None else x


WEIGHT_NAMES = ("conv1.weight", "conv1.bias", "bn1.weight", "bn1.bias", "conv2.weight", "bn2.weight", "bn2.bias")


def random_weights(seed=0, cin=2, c1=3, c2=4):
    rng = np.random.default_rng(seed)
    shapes = {"conv1.weight": (c1, cin, 3, 3), "conv1.bias": (1, c1, 1, 1), "bn1.weight": (c1,), "bn1.bias": (c1,),
              "conv2.weight": (c2, c1, 1, 1), "bn2.weight": (c2,), "bn2.bias": (c2,)}
    w = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    w["bn1.weight"] = (np.abs(w["bn1.weight"]) + 0.5).astype(np.float32)
    return w


def build(weights, bn1="BN", bn2="BN", with_gn=False):
    model = TwoBN(bn1=bn1, bn2=bn2, with_gn=with_gn)
    tensors = dict(list(model.named_parameters()) + list(model.named_buffers()))
    for k, v in weights.items():
        if k in tensors:
            t = tensors[k]
            t._reset(mge.tensor(v.reshape(t.shape)))
    return model


def bn_state(model):
    return {f"{layer}.{s}": getattr(getattr(model, layer), s).numpy().ravel().copy()
            for layer in ("bn1", "bn2") for s in ("running_mean", "running_var")}


def main(out_dir):
    dist.init("auto")
    rank, world = dist.get_rank(), dist.get_world_size()
    inp = np.load(os.path.join(out_dir, "in.npz"))
    weights = {k: inp[k] for k in WEIGHT_NAMES}
    out = {"world": np.array(world)}
    for name, (bn1, bn2, mode, num_samples) in SCENARIOS.items():
        count = int(inp[f"{name}_r{rank}_n"])
        batches = [inp[f"{name}_r{rank}_b{i}"] for i in range(count)]
        if name == "local" and rank == 0:  # every batch form on the same run
            batches = [(batches[0], np.zeros(len(batches[0]), np.int32)), mge.tensor(batches[1]),
                       [mge.tensor(batches[2]), None]]
        model = build(weights, bn1, bn2)
        with dist.count_collectives() as counter:
            summary = update_bn_stats(model, batches, num_samples, sync_bn=mode)
        for k, v in bn_state(model).items():
            out[f"{name}.{k}"] = v
        out[f"{name}.samples"] = np.array(summary["samples"])
        out[f"{name}.batches"] = np.array(summary["batches"])
        out[f"{name}.layers"] = np.array(summary["layers"])
        out[f"{name}.per_rank_samples"] = np.array(summary["per_rank_samples"])
        out[f"{name}.mode"] = np.array(summary["sync_bn"])
        out[f"{name}.all_gather"] = np.array(counter["all_gather"])
        out[f"{name}.all_reduce_sum"] = np.array(counter["all_reduce_sum"])
        if name == "local":
            fresh = build(weights, bn1, bn2)
            stats = collect_bn_population_stats(fresh, batches, num_samples, sync_bn=mode)
            for layer, (cnt, mean, var) in stats.items():
                out[f"collect.{layer}.count"] = np.array(cnt)
                out[f"collect.{layer}.mean"] = mean
                out[f"collect.{layer}.var"] = var
            for k, v in bn_state(fresh).items():
                out[f"collect.untouched.{k}"] = v
    np.savez(os.path.join(out_dir, f"out_{rank}.npz"), **out)


if __name__ == "__main__":
    main(sys.argv[1])
