"""python -m basebn.tools.selfcheck [--quick] [--json] [--devices N]   (CPU: mpiexec -n 2 python -m ...)

Builds (or loads) basebn's kernel library and checks every custom op on the current device against the
pure-MegEngine path (:func:`basebn.ops.kernel_selfcheck.run_selfcheck`, which states the tolerances):
one row per op with its cases, max abs / rel error, kernel and fallback time and verdict. With several
processes (mpiexec; ``--devices N`` starts N GPU processes) each checks its own device and together they
check SyncBatchNorm (:func:`check_sync_bn`: uneven shards and an empty rank vs one-process BN of the whole batch,
tolerance 1e-4: a float64 host merge of per-rank float32 moments vs one float32 reduction); rank 0 prints,
other ranks add the rows that failed there. ``--json``: one JSON object.
Exit 0: all agree; 1: an op disagrees beyond its tolerance (or raised); 2: one-line error (e.g. the kernel
library did not build: there is nothing to check, training then uses the pure-MegEngine path).
"""
import contextlib
import json
import sys
from typing import Any, Dict, List, Tuple

import numpy as np

import megengine as mge
import megengine.functional as F
from megengine.autodiff import GradManager
from megengine.distributed import launcher

from .. import distributed
from ..cli import cli_main
from ..layers.sync_bn import SyncBatchNorm, local_statistics
from ..ops import bn_ops
from ..ops.kernel_library import kernel_error, kernel_library, load_kernels
from ..ops.kernel_selfcheck import (
    CheckRow,
    ErrorTally,
    device_is_gpu,
    device_name,
    format_rows,
    run_selfcheck,
    skip_reason,
    skipped_rows,
    timed,
)
from ..utils.cli_args import MAX_DEVICES, OneLineArgumentParser, bounded_int

__all__ = ["SelfcheckError", "SYNC_BN_OPS", "SYNC_BN_TOLERANCE", "check_sync_bn", "run_all_checks", "selfcheck",
           "main"]

SYNC_BN_OPS = ("sync_bn",)
SYNC_BN_TOLERANCE = 1e-4
_EPS = 1e-5


class SelfcheckError(Exception):
    """Nothing can be checked here (the kernel library did not build)."""


def selfcheck(quick: bool = False) -> Tuple[List[CheckRow], List[Tuple[int, Dict[str, Any]]], Any, int]:
    """Check every custom op against the pure-MegEngine path; a collective when several processes run.

    Args:
        quick: fewer, smaller cases.

    Returns:
        (rows of this rank, failed rows of the other ranks as (rank, row dict), library info, failures on all
        ranks).

    Raises:
        SelfcheckError: the kernel library did not build.
    """
    lib = kernel_library()
    if lib is None:
        raise SelfcheckError(f"the basebn kernel library did not build, so there is nothing to check (training "
                             f"uses the pure-MegEngine path): {kernel_error()}")
    rows = run_all_checks(quick=quick)
    failed_here = [r for r in rows if r.verdict == "FAIL"]
    others, total = [], len(failed_here)
    world = distributed.get_world_size()
    if world > 1:  # who failed where: counts first (same shape everywhere), then each rank's report
        counts = distributed.all_gather(np.array([len(failed_here)], dtype=np.int64))
        total = int(counts.sum())
        for rank in range(1, world):
            if int(counts[rank][0]) == 0:
                continue
            # (the sync_bn row is already every rank's worst)
            text = json.dumps([r._asdict() for r in failed_here if r.family != "sync_bn"]) \
                if distributed.get_rank() == rank else ""
            others += [(rank, r) for r in json.loads(_broadcast_text(text, rank))]
    return rows, others, lib, total


def run_all_checks(quick: bool = False) -> List[CheckRow]:
    """Every op's row (:func:`run_selfcheck`), then SyncBatchNorm's: a collective when several processes run,
    so every rank calls this with the same ``quick``.

    Args:
        quick: fewer, smaller cases.
    """
    rows = run_selfcheck(quick=quick)
    reason = skip_reason("sync_bn", load_kernels(), device_is_gpu())
    if reason is None and distributed.get_world_size() < 2:
        reason = "one process (launch with mpiexec -n 2, or --devices N on GPUs)"
    if reason:
        return rows + skipped_rows(SYNC_BN_OPS, "sync_bn", reason)
    return rows + check_sync_bn(reps=0 if quick else 2)


def _shards(total, world, empty_rank):
    """Per-rank batch sizes: uneven (rank r gets more than rank r + 1), or the last rank empty."""
    if empty_rank:
        base = [total // (world - 1)] * (world - 1)
        base[0] += total - sum(base)
        return base + [0]
    weights = np.arange(world, 0, -1, dtype=np.float64)
    sizes = np.maximum(1, np.floor(total * weights / weights.sum())).astype(int)
    sizes[0] += total - sizes.sum()
    return [int(s) for s in sizes]


def _sync_bn_step(c, w, b, x, dy, whole_batch=False):
    """y, dx, dweight, dbias, running mean and var after one training step of a new SyncBatchNorm (weight
    ``w``, bias ``b``) on ``x`` with upstream gradient ``dy``; ``whole_batch``: local statistics, no collective."""
    bn = SyncBatchNorm(c, eps=_EPS, momentum=0.9)
    bn.weight[...] = mge.tensor(w.reshape(bn.weight.shape))
    bn.bias[...] = mge.tensor(b.reshape(bn.bias.shape))
    x, dy = mge.tensor(x), mge.tensor(dy)
    gm = GradManager().attach([x, bn.weight, bn.bias])
    with gm, (local_statistics(bn) if whole_batch else contextlib.nullcontext()):
        y = bn(x)
        gm.backward(y, dy)
    return (y, x.grad, F.concat([bn.weight.grad.reshape(-1), bn.bias.grad.reshape(-1)]),
            bn.running_mean.reshape(-1), bn.running_var.reshape(-1))


def check_sync_bn(reps: int) -> List[CheckRow]:
    """SyncBatchNorm (kernels) on each rank's shard vs one-process fallback BN of the whole batch: one row, the
    worst error of any rank (a collective: every rank calls it).

    Args:
        reps: random cases to run.
    """
    rank, world = distributed.get_rank(), distributed.get_world_size()
    rng = np.random.default_rng(2)  # the same global batches on every rank
    e = ErrorTally()
    for shape, empty_rank in (((4 * world + 1, 3, 5, 4), False), ((4 * world, 5), True), ((3 * world, 2, 3), False)):
        c = shape[1]
        x = (rng.standard_normal(shape) * 1.5 + 3.0).astype(np.float32)
        dy = rng.standard_normal(shape).astype(np.float32)
        w, b = rng.uniform(0.5, 1.5, c).astype(np.float32), rng.standard_normal(c).astype(np.float32)
        sizes = _shards(shape[0], world, empty_rank)
        lo, hi = sum(sizes[:rank]), sum(sizes[:rank + 1])
        what = f"{shape} shards {sizes}"
        results = {}
        for path in ("kernel", "fallback"):
            with bn_ops.use_backend(path):
                out, t = timed(lambda: _sync_bn_step(c, w, b, x[lo:hi], dy[lo:hi]), reps)
            # the parameter gradients' all-reduce of data-parallel training
            results[path] = out[:2] + (distributed.all_reduce_sum(out[2]),) + out[3:] + (t,)
        with bn_ops.use_backend("fallback"):
            ry, rdx, rdwb, rrm, rrv = _sync_bn_step(c, w, b, x, dy, whole_batch=True)
        ky, kdx, kdwb, krm, krv, tk = results["kernel"]
        e.compare(ky, ry.numpy()[lo:hi], f"y {what}")
        e.compare(kdx, rdx.numpy()[lo:hi], f"dx {what}")
        e.compare(kdwb, rdwb, f"dweight/dbias {what}")
        e.compare(krm, rrm, f"running_mean {what}")
        e.compare(krv, rrv, f"running_var {what}")
        e.cases, e.kernel_s, e.fallback_s = e.cases + 1, e.kernel_s + tk, e.fallback_s + results["fallback"][-1]
    # every rank reports the worst error of any rank
    worst = distributed.all_gather(np.array([e.max_abs, e.max_rel], dtype=np.float64))
    e.max_abs, e.max_rel = float(np.max(worst[:, 0])), float(np.max(worst[:, 1]))
    if not e.notes:
        e.notes = [f"on another rank of {world}"]
    return [e.row("sync_bn", "sync_bn", SYNC_BN_TOLERANCE)]


def _broadcast_text(text, src):
    """``text`` of rank ``src`` on every rank (a fixed-size byte buffer)."""
    size = distributed.broadcast(np.array([len(text.encode())], dtype=np.int64), src=src)
    buf = np.zeros(int(size[0]), dtype=np.uint8)
    if distributed.get_rank() == src:
        buf[:] = np.frombuffer(text.encode(), dtype=np.uint8)
    return distributed.broadcast(buf, src=src).tobytes().decode()


def _report(rows, others, lib, as_json):
    if as_json:
        print(json.dumps({"device": device_name(), "library": lib["path"], "cuda": lib["cuda"],
                          "world_size": distributed.get_world_size(), "rows": [r._asdict() for r in rows],
                          "failed_on_other_ranks": [dict(r, rank=k) for k, r in others]}))
        return
    print(f"basebn selfcheck on {device_name()} ({distributed.get_world_size()} process(es)); library {lib['path']}")
    print(format_rows(rows))
    for rank, r in others:
        print(f"rank {rank}: {r['op']} FAIL: max rel err {r['max_rel']:.2e} > {r['tol']:.0e} ({r['note']})")


def _run(quick, as_json):
    """The self-check in this process (one rank of a job); returns the exit code."""
    try:
        rows, others, lib, failures = selfcheck(quick=quick)
    except SelfcheckError as exc:
        print(f"error: {exc}", file=sys.stderr)
        if distributed.is_multiprocess_job():
            distributed.abort_job(2)
        return 2
    if distributed.is_main_process():
        _report(rows, others, lib, as_json)
    distributed.barrier()
    return 1 if failures else 0


def _worker(quick, as_json):
    """One process of a ``--devices N`` launch: its exit status is the self-check's."""
    code = _run(quick, as_json)
    if code:
        sys.exit(code)


@cli_main
def main(argv=None):
    """Run the self-check; 0 when every op agrees, 1 when one does not, 2 on a one-line error."""
    parser = OneLineArgumentParser(prog="python -m basebn.tools.selfcheck", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few small cases (what training runs automatically)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--devices", type=bounded_int(1, MAX_DEVICES), default=1,
                        help="GPU processes (MegEngine's launcher, NCCL): each checks its GPU, together SyncBN "
                             "(CPU: mpiexec -n N python -m basebn.tools.selfcheck)")
    args = parser.parse_args(argv)
    if args.devices > 1:
        if not mge.is_cuda_available():
            print("error: --devices needs GPUs; on CPU run: mpiexec -n N python -m basebn.tools.selfcheck",
                  file=sys.stderr)
            return 2
        try:
            launcher(_worker, n_gpus=args.devices, world_size=args.devices, rank_start=0)(args.quick, args.json)
        except AssertionError as exc:  # the launcher's way of saying a worker exited non-zero
            print(f"error: {exc} (its own output is above)", file=sys.stderr)
            return 1
        return 0
    return _run(args.quick, args.json)


if __name__ == "__main__":
    sys.exit(main())
