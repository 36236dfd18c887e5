"""The ``"mpi"`` backend: ``mpi4py`` on ``COMM_WORLD`` (processes started by ``mpiexec``).

Tensors travel through numpy: ``Tensor.numpy()`` -> buffer-interface collective -> ``mge.tensor``
with the input's dtype and device. ``mpi4py`` is imported only when this backend is created.

A ``group`` argument is an mpi4py communicator (see :func:`basebn.distributed.new_group`); ``None`` is
``COMM_WORLD``. Ranks given to ``src``/``dst`` are ranks inside that communicator.
"""
import sys

import numpy as np

from ._common import from_numpy, to_numpy
from .shm_files import MAPPED_AT_INIT, unlink_mapped_shm_files

# dtypes MPI can sum natively; others (float16, bool) are summed in numpy after an all-gather
_NATIVE_SUM = {np.dtype(t) for t in (
    np.float32, np.float64, np.int8, np.int16, np.int32, np.int64,
    np.uint8, np.uint16, np.uint32, np.uint64, np.complex64, np.complex128,
)}


def _bytes(arr):
    """A flat uint8 view of a C-contiguous array (MPI.BYTE transfers are exact for any dtype)."""
    return arr.reshape(-1).view(np.uint8)


def _abort_on_uncaught_exception(comm):
    """An exception no one catches prints its traceback on its rank, then ends every rank (none hangs)."""
    previous = sys.excepthook

    def hook(kind, value, tb):
        previous(kind, value, tb)
        sys.stderr.flush()
        unlink_mapped_shm_files()
        comm.Abort(1)

    sys.excepthook = hook


class MPIBackend:
    """Collectives on mpi4py's COMM_WORLD (or a sub-communicator given as `group`)."""
    name = "mpi"

    def __init__(self):
        from mpi4py import MPI  # noqa: lazy on purpose: single-process use never needs MPI

        self.MPI = MPI
        self.comm = MPI.COMM_WORLD
        self.rank = self.comm.Get_rank()
        self.world_size = self.comm.Get_size()
        _abort_on_uncaught_exception(self.comm)
        self.comm.Barrier()  # every rank is past MPI_Init: MPICH's /dev/shm file is mapped on each
        unlink_mapped_shm_files(MAPPED_AT_INIT)  # so no ending (abort, signal, crash) leaves it behind

    def _c(self, group):
        return self.comm if group is None else group

    def barrier(self, group=None):
        self._c(group).Barrier()

    def _allgather_np(self, arr, comm):
        out = np.empty((comm.Get_size(),) + arr.shape, dtype=arr.dtype)
        comm.Allgather([_bytes(arr), self.MPI.BYTE], [_bytes(out), self.MPI.BYTE])
        return out

    def all_reduce_sum(self, x, group=None):
        comm = self._c(group)
        arr, like = to_numpy(x)
        if arr.dtype in _NATIVE_SUM:
            out = np.empty_like(arr)
            comm.Allreduce(arr, out, op=self.MPI.SUM)
        else:  # float16 / bool: gather, then sum in a wide type in rank order (same on every rank)
            g = self._allgather_np(arr, comm)
            wide = np.float64 if np.issubdtype(arr.dtype, np.floating) else np.int64
            out = np.require(g.astype(wide).sum(axis=0).astype(arr.dtype), requirements="C")
        return from_numpy(out, like)

    def all_gather(self, x, group=None):
        arr, like = to_numpy(x)
        return from_numpy(self._allgather_np(arr, self._c(group)), like)

    def broadcast(self, x, src=0, group=None):
        comm = self._c(group)
        arr, like = to_numpy(x)
        buf = np.array(arr, copy=True, order="C")
        comm.Bcast([_bytes(buf), self.MPI.BYTE], root=src)
        return from_numpy(buf, like)

    def new_group(self, ranks):
        """Communicator over ``ranks`` (collective over COMM_WORLD: every rank must call it).

        Ranks not in ``ranks`` get ``MPI.COMM_NULL`` (not ``None``, which would mean the world).
        """
        ranks = [int(r) for r in ranks]
        return self.comm.Create(self.comm.Get_group().Incl(ranks))
