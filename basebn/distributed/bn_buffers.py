"""sync_bn_buffers: make the BN running statistics of every rank the same, with one collective.

Local BN (each rank normalising its own batch) leaves each rank with its own running mean/variance, so ranks
would evaluate and save different models. This averages them over the ranks ("mean": the plain average of
means and of variances, as timm's ``distribute_bn(reduce=True)``) or copies rank 0's ("broadcast"), all
layers packed into ONE float32 buffer. BN layers are found as MegEngine ``_BatchNorm`` modules with
trainable (Parameter) or no affine (this package sits below basebn.layers); FrozenBatchNorm2d's fixed
buffers are left alone.
"""
import megengine as mge
import megengine.functional as F
from megengine.module.batchnorm import _BatchNorm

from .. import distributed as dist

__all__ = ["SYNC_MODES", "sync_bn_buffers"]

SYNC_MODES = ("mean", "broadcast")


def _trainable_bn_buffers(model):
    out = []
    for m in model.modules():
        if not isinstance(m, _BatchNorm):
            continue
        rm, rv = getattr(m, "running_mean", None), getattr(m, "running_var", None)
        if not isinstance(rm, mge.Tensor) or not isinstance(rv, mge.Tensor):
            continue
        if getattr(m, "affine", False) and not isinstance(m.weight, mge.Parameter):
            continue  # FrozenBatchNorm2d: buffers only, fixed
        out.extend([rm, rv])
    return out


def sync_bn_buffers(model, mode="mean"):
    """Average (``mode="mean"``) or broadcast from rank 0 (``"broadcast"``) the running mean and variance of
    every trainable BN layer of `model` over all ranks, in ONE collective; returns how many buffers it set.
    One process: nothing to do (0). Every rank must call it, with the same model structure."""
    if mode not in SYNC_MODES:
        raise ValueError(f"sync_bn_buffers: mode must be one of {', '.join(SYNC_MODES)}, got {mode!r}")
    world = dist.get_world_size()
    buffers = _trainable_bn_buffers(model)
    if world <= 1 or not buffers:
        return 0
    flat = F.concat([b.astype("float32").reshape(-1) for b in buffers])
    if mode == "mean":
        flat = dist.all_reduce_sum(flat) / world
    else:
        flat = dist.broadcast(flat, src=0)
    offset = 0
    for b in buffers:
        b[...] = flat[offset:offset + b.size].reshape(b.shape).astype(b.dtype)
        offset += b.size
    return len(buffers)
