"""python -m basebn.train CONFIG.py [KEY=VALUE ...] [--resume [--allow-config-change] | --restart] [--devices N]
   python -m basebn.train RUN_DIR --resume [KEY=VALUE ...]

A run directory (or its config.json) as CONFIG is the run's resolved config with output_dir the run directory: its
--resume needs no override again.

Multi-process: on GPUs `--devices N` starts N processes with MegEngine's launcher (NCCL), and
`--num-machines M --machine-rank R --dist-url tcp://HOST:PORT` spreads them over M machines;
on CPU run `mpiexec -n N python -m basebn.train ...` (MPI; `-f HOSTFILE` for several machines).
"""
import json
import os
import random
import sys
import urllib.parse

import numpy as np

import megengine as mge
from megengine.distributed import launcher
from loguru import logger

from . import distributed as dist
from .checkpoint import LATEST, CheckpointError, complete_run, find_checkpoint, load_latest, member_fit
from .cli import USER_ERRORS, cli_main
from .config import ConfigError, config_diff, load_config
from .engine.build import (build_data, build_ema, build_grad_scaler, build_precise_bn_loader, build_train_data,
                           build_train_model, build_trainer, scaled_base_lr)
from .engine.hooks import default_hooks
from .engine.logging import setup_logging
from .engine.lr_schedule import freeze_warning, schedule_warning
from .engine.metrics_log import metrics_path, truncate_metrics
from .engine.resume_check import check_resume, config_changes, describe_changes
from .engine.run_dir import open_run_dir
from .engine.optimizer import build_optimizer
from .engine.training_state import restore_training_state
from .engine.run_record import RunRecord
from .engine.trainer import NonFiniteTrainingError
from .utils.cli_args import MAX_DEVICES, MAX_MACHINES, OneLineArgumentParser, bounded_int
from .utils.cpu_runtime import use_inline_cpu_device
from .utils.fs import atomic_write_bytes, remove_stale_tmp

__all__ = ["train", "main"]


def seed_all(seed):
    """Seed Python's, numpy's and MegEngine's generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    mge.random.seed(seed)


def _save_config(cfg, run_dir):
    if dist.is_main_process():
        resolved = json.dumps(cfg.to_dict(), indent=2, default=str).encode()
        atomic_write_bytes(os.path.join(run_dir, "config.json"), resolved)
        atomic_write_bytes(os.path.join(run_dir, "config_diff.json"),
                           json.dumps(config_diff(cfg), indent=2, default=str).encode())


def train(cfg, resume=False, restart=False):
    """Train with resolved config `cfg`; returns the last evaluation's metrics dict.

    Rank 0 locks cfg.output_dir for the whole run; a previous run there is refused unless resume
    (continue it) or restart (move it aside).
    """
    dist.init("auto")
    run_dir = cfg.output_dir
    lock, moved_to = open_run_dir(run_dir, resume, restart) if dist.is_main_process() else (None, None)
    try:
        return _train_locked(cfg, run_dir, resume, moved_to)
    finally:
        if lock is not None:
            lock.release()


def _start_logging(cfg, run_dir, moved_to):
    setup_logging(run_dir)
    if moved_to:
        logger.info(f"--restart: the previous run in {run_dir} was moved to {moved_to}")
    if dist.is_main_process():
        for name in remove_stale_tmp(run_dir):
            logger.info(f"removed {name}, left by a write that was interrupted")
    logger.info(f"run directory {run_dir}, {dist.get_world_size()} process(es), backend {dist.backend()}")
    logger.info("config differs from the defaults in: " + json.dumps(config_diff(cfg), default=str))
    for warning in (schedule_warning(cfg.solver, scaled_base_lr(cfg)),
                    freeze_warning(cfg.solver, cfg.bn.freeze_last_epochs, scaled_base_lr(cfg))):
        if warning and dist.is_main_process():
            logger.warning(warning)


def _train_locked(cfg, run_dir, resume, moved_to):
    """The run, assembled from engine/build.py's build_* calls (pycls's train_model reads this way)."""
    _start_logging(cfg, run_dir, moved_to)
    seed_all(cfg.seed)
    grad_scaler = build_grad_scaler(cfg)  # first: without a GPU it turns amp off in cfg
    train_ds, train_loader = build_train_data(cfg)
    _, test_loader = build_data(cfg, train=False)
    precise_loader = build_precise_bn_loader(cfg)
    model = build_train_model(cfg, train_ds)
    base_lr = scaled_base_lr(cfg)
    optimizer = build_optimizer(model, cfg.solver, base_lr)
    ema = build_ema(cfg, model)
    record = RunRecord()
    hooks = default_hooks(cfg, base_lr, run_dir, test_loader, precise_loader, record, progress=True)
    trainer = build_trainer(cfg, model, train_loader, optimizer, hooks, ema=ema, grad_scaler=grad_scaler,
                            record=record)
    start_epoch = _resume(trainer, run_dir) if resume else 1
    _save_config(cfg, run_dir)
    if start_epoch > cfg.solver.max_epoch:
        return None  # _resume said what it found and completed
    trainer.train(start_info=[start_epoch, 1], max_info=[cfg.solver.max_epoch, len(train_loader)])
    return record.last_metrics


def _resume(trainer, run_dir):
    """Restore the run's latest checkpoint into `trainer`; returns the first epoch to train.

    Metrics of epochs after the checkpoint are dropped (they are redone); what a kill left missing is
    completed (best, and final of a run that had finished its epochs). A run stopped before its first
    checkpoint starts again from epoch 1.
    """
    main = dist.is_main_process()
    found = load_latest(run_dir, fits=member_fit(trainer.model))  # a file that cannot fit: refused unread
    if found is None:
        if not any(os.path.isfile(p) for p in (os.path.join(run_dir, "config.json"), metrics_path(run_dir))):
            raise CheckpointError(f"--resume: no {LATEST} in {run_dir!r}; start without --resume "
                                  f"(or set output_dir to the run you want to continue)")
        logger.info(f"--resume: {run_dir} has no checkpoint yet (the run stopped in its first epoch); "
                    f"starting from epoch 1")
        if main:
            truncate_metrics(run_dir, 0)
        return 1
    path, ckpt = found
    changes = config_changes(trainer.cfg, run_dir)  # main() refused them unless --allow-config-change
    if changes:
        logger.warning(f"--resume --allow-config-change: continuing with a changed config: {describe_changes(changes)}")
    epoch = restore_training_state(trainer, ckpt, source=path)
    logger.info(f"resumed from {path} after epoch {epoch}")
    if main:
        rows = truncate_metrics(run_dir, epoch)
        last = rows[-1] if rows and rows[-1]["epoch"] == epoch else None
        finished = epoch >= trainer.cfg.solver.max_epoch
        done = complete_run(run_dir, ckpt, finished=finished, metrics=last)
        if done:
            logger.info(f"--resume completed what the stopped run left missing: {'; '.join(done)}")
        elif finished:
            logger.info(f"--resume: {run_dir} finished its {epoch} epochs and its files are complete")
    return epoch + 1


def _parse(argv):
    p = OneLineArgumentParser(prog="python -m basebn.train", description=__doc__.split("\n")[0])
    p.add_argument("config", metavar="CONFIG", help="experiment file, e.g. configs/quickstart.py, or a run directory "
                                                    "(or its config.json): the run's config, output_dir the run")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. solver.max_epoch=3")
    again = p.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true", help="continue the run in output_dir from its last checkpoint")
    again.add_argument("--restart", action="store_true",
                       help="start over in output_dir, moving a previous run there to OUTPUT_DIR.old-TIMESTAMP")
    p.add_argument("--allow-config-change", action="store_true",
                   help="with --resume: continue even though the config differs from the run's (batch size, lr, "
                        "model, max_epoch, ...); without it such a resume is refused, naming what differs")
    p.add_argument("--devices", type=bounded_int(1, MAX_DEVICES), default=1,
                   help="GPU processes per machine (CPU: use mpiexec -n N)")
    p.add_argument("--num-machines", type=bounded_int(1, MAX_MACHINES), default=1,
                   help="machines taking part (GPU launcher)")
    p.add_argument("--machine-rank", type=bounded_int(0, MAX_MACHINES - 1), default=0,
                   help="this machine's index, 0 on the master")
    p.add_argument("--dist-url", default=None, help="tcp://MASTER_HOST:PORT when --num-machines > 1")
    args = p.parse_intermixed_args(argv)
    if args.allow_config_change and not args.resume:
        p.error("--allow-config-change goes with --resume (a new run takes any config)")
    return args


def launcher_options(devices, num_machines=1, machine_rank=0, dist_url=None):
    """Keyword arguments of megengine.distributed.launcher for this machine's share of the job."""
    if devices < 1 or num_machines < 1 or not 0 <= machine_rank < num_machines:
        raise ConfigError(f"need --devices >= 1, --num-machines >= 1 and 0 <= --machine-rank < --num-machines; "
                          f"got {devices}, {num_machines}, {machine_rank}")
    options = dict(n_gpus=devices, world_size=devices * num_machines, rank_start=machine_rank * devices)
    if num_machines == 1:
        return options
    url = urllib.parse.urlsplit(dist_url or "")
    try:
        port = url.port
    except ValueError:
        port = None
    if url.scheme != "tcp" or not url.hostname or not port:
        raise ConfigError(f"--num-machines {num_machines} needs --dist-url tcp://MASTER_HOST:PORT (the machine of "
                          f"--machine-rank 0, a free port), got {dist_url!r}")
    return dict(options, master_ip=url.hostname, port=port)


def _worker(config, overrides, resume, restart):
    """One launcher process: a user error prints its line and ends this worker (the launcher ends the rest)."""
    try:
        train(load_config(config, overrides), resume=resume, restart=restart)
    except USER_ERRORS as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


def _nonfinite_advice(run_dir):
    latest = find_checkpoint(run_dir, LATEST)
    if latest is not None:
        return f" The last checkpoint {latest} is intact: resume from it with --resume."
    return " No checkpoint had been written yet."


@cli_main
def main(argv=None):
    """CLI entry: parse argv, train (or launch GPU workers); returns the exit code."""
    args = _parse(argv)
    cfg = load_config(args.config, args.overrides)  # fail on bad keys before anything starts
    if not mge.is_cuda_available() and not cfg.trace:
        # the custom ops wait for no dispatcher queue (a traced step would not dump); the OpenMP worker spins
        # between ops unless other ranks share the cores
        use_inline_cpu_device(omp_spin=not dist.is_multiprocess_job())
    if args.resume:
        check_resume(cfg, allow_config_change=args.allow_config_change)
    if args.devices > 1 or args.num_machines > 1:
        options = launcher_options(args.devices, args.num_machines, args.machine_rank, args.dist_url)
        if not mge.is_cuda_available():
            raise ConfigError("--devices/--num-machines need GPUs; on CPU run: mpiexec -n N python -m basebn.train "
                              "CONFIG ... (several machines: mpiexec -f HOSTFILE -n N ...)")
        try:
            launcher(_worker, **options)(args.config, args.overrides, args.resume, args.restart)
        except AssertionError as exc:  # the launcher's way of saying a worker exited non-zero
            print(f"error: {exc} (its own message is above)", file=sys.stderr)
            return 1
        return 0
    try:
        train(cfg, resume=args.resume, restart=args.restart)
    except NonFiniteTrainingError as exc:
        logger.error(str(exc) + _nonfinite_advice(cfg.output_dir))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
