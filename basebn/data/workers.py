"""Worker processes that build a BatchLoader's batches and hand them over through shared memory.

Workers are forked (they inherit the dataset and transforms; nothing is pickled) and write each
batch into one of their ``prefetch`` slots of a single anonymous shared mmap created before the
fork (no /dev/shm names to leak, no size limit of a container's /dev/shm); the pipes carry only
(epoch, batch, slot) tasks and shape/status replies. Batch b goes to worker b % num_workers, so
each worker's replies come in batch order and the consumer needs no reordering. A worker exits
when its parent dies: prctl(PR_SET_PDEATHSIG, SIGKILL) on Linux plus a getppid() poll. PDEATHSIG
fires when the *thread* that forked ends, so the pool must be started from a long-lived thread
(the trainer iterates from the main thread).
"""

import contextlib
import ctypes
import mmap
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import sys
import traceback
from collections import deque
from typing import Callable, Iterator, List, Tuple

import cv2
import numpy as np

from .errors import DataError

__all__ = ["WorkerPool", "default_num_workers"]

_MAX_AUTO_WORKERS = 8
_POLL_S = 1.0            # how often an idle worker checks that its parent is alive
_STALL_S = 600.0         # a batch not delivered for this long means a stuck worker
_ALIGN = 64
_PR_SET_PDEATHSIG = 1


def default_num_workers() -> int:
    """The CPUs this process may run on (``os.sched_getaffinity``), at most 8."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(_MAX_AUTO_WORKERS, cpus))


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a worker, chained to the re-raised exception."""

    def __str__(self):
        return self.args[0]


def _die_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGKILL this process when its parent ends; exit now if it already has."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):  # no libc prctl: the getppid() poll remains
            pass
    if os.getppid() != parent_pid:
        os._exit(0)


def _worker_main(make_batch, conn, mem, slot_bytes: int, label_offset: int, parent_pid: int,
                 stderr_fd: int):
    _die_with_parent(parent_pid)
    os.dup2(stderr_fd, 2)  # stderr was silenced around the fork (see _safe_fork)
    os.close(stderr_fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle
    while True:
        try:
            if not conn.poll(_POLL_S):
                if os.getppid() != parent_pid:
                    return
                continue
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        epoch, batch, slot = task
        try:
            x, y, replaced = make_batch(epoch, batch)
            if x.nbytes > label_offset or y.nbytes > slot_bytes - label_offset:
                raise RuntimeError(f"batch {batch} ({x.shape} {x.dtype}, {y.shape} {y.dtype}) "
                                   f"does not fit its shared-memory slot")
            base = slot * slot_bytes
            np.frombuffer(mem, x.dtype, x.size, base).reshape(x.shape)[...] = x
            np.frombuffer(mem, y.dtype, y.size, base + label_offset).reshape(y.shape)[...] = y
            reply = ("ok", batch, x.shape, x.dtype.str, y.shape, y.dtype.str, replaced)
        except Exception as exc:  # noqa: BLE001 - handed to the consumer and re-raised there
            text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            try:
                pickle.dumps(exc)
            except Exception:  # noqa: BLE001
                exc = RuntimeError(f"{type(exc).__name__}: {exc}")
            reply = ("error", batch, exc, text)
        try:
            conn.send(reply)
        except (BrokenPipeError, OSError):
            return


@contextlib.contextmanager
def _safe_fork():
    """Make forking safe and quiet; yields a duplicate of the real stderr for the workers' fd 2.

    cv2 is set to one thread while forking, so the workers inherit numThreads=1 and never touch
    the parent's cv2 thread pool (its threads do not exist in a child: using or even resizing it
    there deadlocks); the parent gets its thread count back afterwards. fd 2 is silenced because
    MegEngine's fork handler prints CUDA-probe noise on CPU-only machines.
    """
    threads = cv2.getNumThreads()
    cv2.setNumThreads(1)
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)
    try:
        yield saved
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        cv2.setNumThreads(threads)


def _describe_exit(proc) -> str:
    code = proc.exitcode
    if code is not None and code < 0:
        name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
        hint = " (often: the machine ran out of memory)" if -code == signal.SIGKILL else ""
        return f"was killed by {name}{hint}"
    if code is None:
        return "stopped answering (its pipe is closed)"
    return f"exited with code {code}"


class WorkerPool:
    """``num_workers`` forked processes running ``make_batch(epoch, batch) -> (x, y, replaced)``.

    ``slot_bytes`` must hold one batch: images at offset 0, labels at ``label_offset``.
    """

    def __init__(self, make_batch: Callable, num_workers: int, prefetch: int, images_bytes: int,
                 labels_bytes: int):
        self.num_workers = int(num_workers)
        self.prefetch = max(1, int(prefetch))
        self.label_offset = -(-int(images_bytes) // _ALIGN) * _ALIGN
        self.slot_bytes = -(-(self.label_offset + int(labels_bytes)) // _ALIGN) * _ALIGN
        self.mem = mmap.mmap(-1, self.slot_bytes * self.num_workers * self.prefetch)
        ctx = multiprocessing.get_context("fork")
        self.procs, self.conns = [], []
        with _safe_fork() as stderr_fd:
            for i in range(self.num_workers):
                parent_end, child_end = ctx.Pipe()
                proc = ctx.Process(target=_worker_main, name=f"basebn-data-worker-{i}", daemon=True,
                                   args=(make_batch, child_end, self.mem, self.slot_bytes,
                                         self.label_offset, os.getpid(), stderr_fd))
                proc.start()
                child_end.close()
                self.procs.append(proc)
                self.conns.append(parent_end)
        self.free = [deque(range(i * self.prefetch, (i + 1) * self.prefetch))
                     for i in range(self.num_workers)]
        self.pending: List[deque] = [deque() for _ in range(self.num_workers)]
        self.closed = False

    @property
    def pids(self) -> List[int]:
        """The worker process ids."""
        return [p.pid for p in self.procs]

    # ------------------------------------------------------------------ one epoch
    def batches(self, epoch: int, num_batches: int) -> Iterator[Tuple[np.ndarray, np.ndarray, list]]:
        """Yield ``(x, y, replaced)`` for batches 0 .. num_batches-1 of ``epoch``, in order."""
        self._drain()
        sent = 0
        for b in range(num_batches):
            while sent < num_batches and self.free[sent % self.num_workers]:
                w = sent % self.num_workers
                slot = self.free[w].popleft()
                self._send(w, (epoch, sent, slot))
                self.pending[w].append(slot)
                sent += 1
            yield self._receive(b % self.num_workers, b)

    def _send(self, w: int, task) -> None:
        """Hand ``task`` to worker ``w``; a worker gone (its pipe closed) is reported as a DataError."""
        try:
            self.conns[w].send(task)
        except (BrokenPipeError, ConnectionResetError, EOFError, OSError):
            self.procs[w].join(timeout=_POLL_S)
            self._worker_died(w, self.procs[w])

    def _worker_died(self, i: int, proc):
        self.close()
        raise DataError(
            f"data loader worker {i} (pid {proc.pid}) {_describe_exit(proc)} while "
            f"preparing batches; the run cannot go on. Lower data.num_workers or "
            f"batch_size, or set data.num_workers=0 to load in the training process.")

    def _receive(self, w: int, batch: int):
        reply = self._wait_reply(w)
        slot = self.pending[w].popleft()
        try:
            if reply[0] == "error":
                _, _, exc, text = reply
                if isinstance(exc, DataError):
                    raise exc
                raise exc from RemoteTraceback(f"\nin data loader worker {w}:\n{text}")
            _, got, xs, xd, ys, yd, replaced = reply
            if got != batch:
                raise RuntimeError(f"data loader worker {w} sent batch {got}, expected {batch}")
            base = slot * self.slot_bytes
            x = np.frombuffer(self.mem, np.dtype(xd), int(np.prod(xs)), base).reshape(xs).copy()
            y = np.frombuffer(self.mem, np.dtype(yd), int(np.prod(ys)),
                              base + self.label_offset).reshape(ys).copy()
            return x, y, replaced
        finally:
            self.free[w].append(slot)

    def _wait_reply(self, w: int):
        conn = self.conns[w]
        watched = [conn] + [p.sentinel for p in self.procs]
        waited = 0.0
        while True:
            ready = multiprocessing.connection.wait(watched, timeout=_POLL_S)
            waited += _POLL_S if not ready else 0.0
            if waited >= _STALL_S:
                self.close()
                raise DataError(f"data loader worker {w} (pid {self.procs[w].pid}) delivered nothing for "
                                f"{_STALL_S:.0f} s (stuck reading data?); set data.num_workers=0 to load in the "
                                f"training process and see where it blocks.")
            if conn in ready:
                try:
                    return conn.recv()
                except (EOFError, OSError):
                    pass  # the worker is gone: reported below
            for i, proc in enumerate(self.procs):
                if proc.exitcode is not None or (i == w and conn in ready):
                    proc.join(timeout=_POLL_S)
                    self._worker_died(i, proc)

    def _drain(self):
        """Collect (and drop) the replies of an iteration the consumer stopped early."""
        for w in range(self.num_workers):
            while self.pending[w]:
                self._wait_reply(w)
                self.free[w].append(self.pending[w].popleft())

    def close(self) -> None:
        """Stop the workers (asking first, then SIGTERM/SIGKILL) and release the shared memory."""
        if self.closed:
            return
        self.closed = True
        shutdown_workers(self.procs, self.conns)
        try:
            self.mem.close()
        except BufferError:  # a batch view still alive somewhere: the GC frees the memory later
            pass


def shutdown_workers(procs, conns) -> None:
    """Ask each worker to exit, then terminate/kill stragglers; close the pipes."""
    for conn in conns:
        try:
            conn.send(None)
        except (BrokenPipeError, OSError):
            pass
    for proc in procs:
        proc.join(timeout=2.0)
        if proc.exitcode is None:
            proc.terminate()
            proc.join(timeout=1.0)
        if proc.exitcode is None:
            proc.kill()
            proc.join()
    for conn in conns:
        conn.close()
