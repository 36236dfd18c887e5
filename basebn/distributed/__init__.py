"""Collectives for the trainer, SyncBatchNorm, precise BN and evaluation, behind one API.

Backends: "nccl" (MegEngine's, GPU, processes from its launcher; not runnable here), "mpi" (mpi4py,
processes from mpiexec: the CPU multi-process path) and "none" (one process, identity). init("auto")
picks one from the environment; every function initialises on first use, and importing this package
never imports mpi4py. Tensor collectives take a Tensor (Tensor out, same dtype and device) or numpy
(numpy out); all ranks must call them in the same order with the same shapes. count_collectives()
counts them with any backend, so single-process tests can check how many a layer would issue.
"""
import contextlib
import os
import sys
import threading
from typing import Any, Iterator, Mapping, Optional, Sequence, Union

import numpy as np

import megengine as mge
import megengine.distributed as mdist

from .bn_buffers import SYNC_MODES as BN_BUFFER_SYNC_MODES, sync_bn_buffers
from .local import LocalBackend
from .mpi import MPIBackend
from .nccl import NCCLBackend
from .shm_files import unlink_mapped_shm_files

__all__ = [
    "init",
    "shutdown",
    "is_initialized",
    "backend",
    "get_rank",
    "get_world_size",
    "is_main_process",
    "barrier",
    "new_group",
    "all_reduce_sum",
    "all_gather",
    "broadcast",
    "collective_count",
    "count_collectives",
    "CollectiveCounter",
    "mpi_world_size_from_env",
    "is_multiprocess_job",
    "launched_rank",
    "abort_job",
    "BACKENDS",
    "sync_bn_buffers",
    "BN_BUFFER_SYNC_MODES",
]

BACKENDS = ("auto", "nccl", "mpi", "none")
"""The backends init takes ("auto": picked from the environment)."""

# environment variables MPI launchers set to the world size (MPICH/Hydra, Open MPI, MVAPICH, PMIx)
_MPI_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE", "PMIX_SIZE",
                  "MPI_LOCALNRANKS")

_lock = threading.RLock()
_impl = None
_KINDS = ("all_reduce_sum", "all_gather", "broadcast")
_counts = dict.fromkeys(_KINDS, 0)


# ------------------------------------------------------------------------------------------ init
def mpi_world_size_from_env(environ: Optional[Mapping[str, str]] = None) -> int:
    """The world size an MPI launcher advertises in the environment, or 0 when there is none.

    Args:
        environ: the environment to read; None: ``os.environ``.
    """
    env = os.environ if environ is None else environ
    for var in _MPI_SIZE_VARS:
        val = env.get(var, "").strip()
        if val:
            try:
                return int(val)
            except ValueError:
                continue
    return 0


def _resolve(name):
    if name not in BACKENDS:
        raise ValueError(f"basebn.distributed backend must be one of {BACKENDS}, got {name!r}")
    if name != "auto":
        return name
    if mdist.is_distributed():
        return "nccl"
    if mpi_world_size_from_env() > 1:
        return "mpi"
    return "none"


def _make(name):
    if name == "nccl":
        return NCCLBackend()
    if name == "mpi":
        try:
            return MPIBackend()
        except ImportError as exc:
            raise RuntimeError(
                "basebn.distributed: backend 'mpi' needs mpi4py and an MPI library "
                "(pip install mpi4py mpich, or pip install -e '.[mpi]')"
            ) from exc
    return LocalBackend()


_MPI_RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK", "PMIX_RANK")


def launched_rank() -> int:
    """This process's rank as its launcher set it (0 when alone), readable before init()."""
    if mdist.is_distributed():
        return mdist.get_rank()
    for var in _MPI_RANK_VARS:
        if os.environ.get(var, "").strip().isdigit():
            return int(os.environ[var])
    return 0


def is_multiprocess_job() -> bool:
    """True when this process is one of several (an MPI launch, or MegEngine's launcher), initialised or not."""
    return mdist.is_distributed() or mpi_world_size_from_env() > 1


def abort_job(code: int) -> None:
    """End every process of the job now with exit status `code`, so no rank waits forever in a collective.

    Under MPI this is MPI_Abort on COMM_WORLD (mpiexec ends every rank); under MegEngine's launcher the
    launcher terminates the other local workers when this one exits non-zero.

    Args:
        code: the exit status.
    """
    sys.stderr.flush()
    sys.stdout.flush()
    if mpi_world_size_from_env() > 1:
        from mpi4py import MPI  # optional dependency, present whenever an MPI launch reached here

        unlink_mapped_shm_files()  # MPI_Abort ends the ranks before MPI_Finalize would remove them
        MPI.COMM_WORLD.Abort(code)
    os._exit(code)


def init(backend: str = "auto") -> str:
    """Select and start the collectives backend. Idempotent.

    Calling it again with ``"auto"`` or the active backend's name is a no-op.

    Args:
        backend: one of BACKENDS.

    Returns:
        The active backend's name.

    Raises:
        ValueError: an unknown backend.
        RuntimeError: another backend is active (call :func:`shutdown` first), or "mpi" without mpi4py.
    """
    global _impl
    with _lock:
        if _impl is not None:
            if backend in ("auto", _impl.name):
                return _impl.name
            raise RuntimeError(
                f"basebn.distributed already initialised with backend {_impl.name!r}; cannot switch to "
                f"{backend!r} (call basebn.distributed.shutdown() first)"
            )
        _impl = _make(_resolve(backend))
        return _impl.name


def shutdown() -> None:
    """Forget the active backend (the next call re-initialises). Does not finalise MPI."""
    global _impl
    with _lock:
        _impl = None


def is_initialized() -> bool:
    """True once a backend has been chosen (by init() or a first collective)."""
    return _impl is not None


def _get():
    impl = _impl
    if impl is None:
        init("auto")
        impl = _impl
    return impl


def backend() -> str:
    """Name of the active backend: ``"nccl"``, ``"mpi"`` or ``"none"``."""
    return _get().name


# ------------------------------------------------------------------------------------- queries
def get_rank() -> int:
    """This process's rank (0 alone)."""
    return _get().rank


def get_world_size() -> int:
    """Number of processes in the job (1 alone)."""
    return _get().world_size


def is_main_process() -> bool:
    """True on rank 0: the one that logs and writes files."""
    return _get().rank == 0


def barrier(group: Any = None) -> None:
    """Wait until every rank (of `group`) reaches this call.

    Args:
        group: a :func:`new_group` group; None: all ranks.
    """
    _get().barrier(group)


def new_group(ranks: Sequence[int]) -> Any:
    """A sub-group for the ``group=`` arguments (mpi: a communicator; nccl: a MegEngine Group).

    With mpi every rank of the world must call it (members get the communicator, others
    ``MPI.COMM_NULL``).

    Args:
        ranks: the member ranks.

    Returns:
        The group.
    """
    return _get().new_group(ranks)


# --------------------------------------------------------------------------------- collectives
def _count(kind):
    with _lock:
        _counts[kind] += 1


def all_reduce_sum(tensor: Union[mge.Tensor, np.ndarray], group: Any = None) -> Union[mge.Tensor, np.ndarray]:
    """Element-wise sum over ranks; same shape and dtype as ``tensor`` (Tensor in, Tensor out).

    Args:
        tensor: this rank's values.
        group: a :func:`new_group` group; None: all ranks.

    Returns:
        The sum, of ``tensor``'s type.
    """
    _count("all_reduce_sum")
    return _get().all_reduce_sum(tensor, group)


def all_gather(tensor: Union[mge.Tensor, np.ndarray], group: Any = None) -> Union[mge.Tensor, np.ndarray]:
    """Every rank's ``tensor`` stacked along a new axis 0: shape ``(world,) + tensor.shape``.

    Args:
        tensor: this rank's values.
        group: a :func:`new_group` group; None: all ranks.

    Returns:
        The stack, of ``tensor``'s type.
    """
    _count("all_gather")
    return _get().all_gather(tensor, group)


def broadcast(tensor: Union[mge.Tensor, np.ndarray], src: int = 0,
              group: Any = None) -> Union[mge.Tensor, np.ndarray]:
    """``src``'s ``tensor`` on every rank (all ranks pass a tensor of the same shape/dtype).

    Args:
        tensor: the values on `src`; a placeholder of the same shape and dtype elsewhere.
        src: the rank that sends.
        group: a :func:`new_group` group; None: all ranks.

    Returns:
        `src`'s values, of ``tensor``'s type.
    """
    _count("broadcast")
    return _get().broadcast(tensor, src, group)


# ------------------------------------------------------------------------------------ counting
def collective_count(kind: Optional[str] = None) -> int:
    """Tensor collectives issued by this process so far.

    Args:
        kind: "all_reduce_sum", "all_gather" or "broadcast"; None: all kinds.
    """
    with _lock:
        if kind is None:
            return sum(_counts.values())
        return _counts[kind]


class CollectiveCounter:
    """Live view of the collectives issued since it was created (see :func:`count_collectives`)."""

    def __init__(self):
        with _lock:
            self._start = dict(_counts)
        self._end = None

    def _now(self):
        return self._end if self._end is not None else _counts

    def __getitem__(self, kind):
        return self._now()[kind] - self._start[kind]

    @property
    def total(self):
        now = self._now()
        return sum(now[k] - self._start[k] for k in _KINDS)

    def as_dict(self):
        return {k: self[k] for k in _KINDS}

    def _stop(self):
        with _lock:
            self._end = dict(_counts)

    def __repr__(self):
        return f"CollectiveCounter(total={self.total}, {self.as_dict()})"


@contextlib.contextmanager
def count_collectives() -> Iterator[CollectiveCounter]:
    """``with count_collectives() as c: ...`` then ``c.total``, ``c["all_gather"]``, ``c.as_dict()``.

    The counter is frozen when the block exits.
    """
    c = CollectiveCounter()
    try:
        yield c
    finally:
        c._stop()
