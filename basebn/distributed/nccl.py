"""The "nccl" backend: MegEngine's own collectives (GPU, processes from its launcher).

Not runnable here (no GPU in this environment or CI): reviewed against MegEngine 1.13's
megengine/distributed/functional.py only. numpy inputs of dtypes NCCL cannot sum (float64, int64, bool)
travel as pickled bytes in int32 tensors and are summed on the host, so dtypes are kept exactly.
"""
import pickle

import megengine as mge
import megengine.distributed as mdist
import numpy as np
from megengine.functional.distributed import all_gather, all_reduce_sum, broadcast

from ._common import is_tensor

_DEVICE_SUM = {np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.int32)}


class NCCLBackend:
    """MegEngine's NCCL collectives; rank and world from megengine.distributed."""
    name = "nccl"

    def __init__(self):
        if not mdist.is_distributed():
            raise RuntimeError(
                "basebn.distributed: backend 'nccl' needs megengine.distributed to be initialised; start the "
                "processes with megengine.distributed.launcher (or call init_process_group first)"
            )
        self.mdist = mdist
        self.rank = mdist.get_rank()
        self.world_size = mdist.get_world_size()
        self._rooted = {}

    # ------------------------------------------------------------------ groups
    def _g(self, group):
        return self.mdist.WORLD if group is None else group

    def _rooted_group(self, group, src):
        """Group with ``src`` first (MegEngine broadcasts from the group's first rank)."""
        g = self._g(group)
        ranks = list(g.proc_ranks)
        if src not in ranks:
            raise ValueError(f"rank {src} is not in the group {ranks}")
        if ranks[0] == src:
            return g
        key = (tuple(ranks), src)
        if key not in self._rooted:
            self._rooted[key] = self.mdist.new_group([src] + [r for r in ranks if r != src])
        return self._rooted[key]

    def new_group(self, ranks):
        return self.mdist.new_group([int(r) for r in ranks])

    def barrier(self, group=None):
        self.mdist.group_barrier(self._g(group))

    # ------------------------------------------------------------------ tensors
    def all_reduce_sum(self, x, group=None):

        if is_tensor(x):
            return all_reduce_sum(x, group=self._g(group))
        arr = np.require(np.asarray(x), requirements="C")
        if arr.dtype in _DEVICE_SUM:
            return all_reduce_sum(mge.tensor(arr, dtype=arr.dtype), group=self._g(group)).numpy()
        parts = self._all_gather_object(arr, group)
        wide = np.float64 if np.issubdtype(arr.dtype, np.floating) else None
        out = np.sum(np.stack(parts).astype(wide) if wide else np.stack(parts), axis=0)
        return np.asarray(out).astype(arr.dtype)

    def all_gather(self, x, group=None):

        g = self._g(group)
        if not is_tensor(x):
            arr = np.require(np.asarray(x), requirements="C")
            if arr.dtype not in _DEVICE_SUM:
                return np.stack(self._all_gather_object(arr, group))
            return self.all_gather(mge.tensor(arr, dtype=arr.dtype), group).numpy()
        shape = tuple(x.shape)
        # MegEngine concatenates along axis 0; a leading 1 turns that into a stack
        out = all_gather(x.reshape((1,) + shape), group=g)
        return out.reshape((g.size,) + shape)

    def broadcast(self, x, src=0, group=None):

        g = self._rooted_group(group, src)
        if not is_tensor(x):
            arr = np.require(np.asarray(x), requirements="C")
            if arr.dtype not in _DEVICE_SUM:
                return self._broadcast_object(arr, src, group)
            return broadcast(mge.tensor(arr, dtype=arr.dtype), group=g).numpy()
        return broadcast(x, group=g)

    # ------------------------------------------------------------------ objects
    @staticmethod
    def _encode(obj):
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        n = len(data)
        padded = np.zeros(((n + 3) // 4) * 4, dtype=np.uint8)
        padded[:n] = np.frombuffer(data, dtype=np.uint8)
        return n, padded.view(np.int32)

    def _all_gather_object(self, obj, group=None):

        g = self._g(group)
        n, words = self._encode(obj)
        sizes = all_gather(mge.tensor(np.array([n], dtype=np.int32), dtype="int32"), group=g)
        sizes = [int(s) for s in sizes.numpy().reshape(-1)]
        width = max(1, max((s + 3) // 4 for s in sizes))
        buf = np.zeros(width, dtype=np.int32)
        buf[: words.size] = words
        out = all_gather(mge.tensor(buf, dtype="int32"), group=g).numpy().reshape(g.size, width)
        return [pickle.loads(out[i].view(np.uint8)[: sizes[i]].tobytes()) for i in range(g.size)]

    def _broadcast_object(self, obj, src=0, group=None):

        g = self._rooted_group(group, src)
        if self.rank == src:
            n, words = self._encode(obj)
        else:
            n, words = 0, np.zeros(0, dtype=np.int32)
        n = int(broadcast(mge.tensor(np.array([n], dtype=np.int32), dtype="int32"), group=g).numpy()[0])
        width = max(1, (n + 3) // 4)
        buf = np.zeros(width, dtype=np.int32)
        buf[: words.size] = words
        out = broadcast(mge.tensor(buf, dtype="int32"), group=g).numpy()
        return obj if self.rank == src else pickle.loads(out.view(np.uint8)[:n].tobytes())
