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
import megengine.module as M
from megengine.module.batchnorm import _BatchNorm

from .. import distributed as dist

__all__ = ["SYNC_MODES", "sync_bn_buffers"]

SYNC_MODES = ("mean", "broadcast")
"""sync_bn_buffers's modes: average over ranks, or rank 0's values."""


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


def sync_bn_buffers(model: M.Module, mode: str = "mean") -> int:
    """Average or broadcast from rank 0 the running mean and variance of every trainable BN layer of `model`
    over all ranks, in ONE collective. Every rank must call it, with the same model structure.

    Args:
        model: the model.
        mode: "mean" (average over ranks) or "broadcast" (rank 0's values).

    Returns:
        How many buffers it set (0 in one process).

    Raises:
        ValueError: an unknown mode.
    """
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
