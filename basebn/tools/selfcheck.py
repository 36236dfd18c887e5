"""python -m basebn.tools.selfcheck [--quick] [--json] [--devices N]   (CPU: mpiexec -n 2 python -m ...)

Builds (or loads) basebn's kernel library and checks every custom op on the current device against the
pure-MegEngine path (:func:`basebn.layers.kernel_selfcheck.run_selfcheck`, which states the tolerances):
one row per op with its cases, max abs / rel error, kernel and fallback time and verdict. With several
processes (mpiexec; ``--devices N`` starts N GPU processes) each checks its own device and together they
check SyncBatchNorm; rank 0 prints, other ranks add the rows that failed there. ``--json``: one JSON object.
Exit 0: all agree; 1: an op disagrees beyond its tolerance (or raised); 2: one-line error (e.g. the kernel
library did not build: there is nothing to check, training then uses the pure-MegEngine path).
"""
import json
import sys

import numpy as np

import megengine as mge
from megengine.distributed import launcher

from .. import distributed
from ..cli import cli_main
from ..layers.kernel_library import kernel_error, kernel_library
from ..layers.kernel_selfcheck import device_name, format_rows, run_selfcheck
from ..utils.cli_args import MAX_DEVICES, OneLineArgumentParser, bounded_int

__all__ = ["SelfcheckError", "selfcheck", "main"]


class SelfcheckError(Exception):
    """Nothing can be checked here (the kernel library did not build)."""


def selfcheck(quick=False):
    """``(rows of this rank, failed rows of the other ranks as (rank, row dict), library info, failures on all
    ranks)``; a collective when several processes run."""
    lib = kernel_library()
    if lib is None:
        raise SelfcheckError(f"the basebn kernel library did not build, so there is nothing to check (training "
                             f"uses the pure-MegEngine path): {kernel_error()}")
    rows = run_selfcheck(quick=quick)
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
