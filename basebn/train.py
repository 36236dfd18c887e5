"""python -m basebn.train CONFIG.py [KEY=VALUE ...] [--resume] [--devices N]

Multi-process: on GPUs `--devices N` starts N processes with MegEngine's launcher (NCCL);
on CPU run `mpiexec -n N python -m basebn.train ...` (MPI).
"""
import argparse
import json
import math
import os
import random
import sys

import numpy as np

import megengine as mge
from megengine.autodiff import GradManager
from loguru import logger

from . import distributed as dist
from .cli import user_errors_exit
from .config import config_diff, load_config
from .engine.build import build_data, build_model_from_cfg, example_input, load_weights
from .engine.checkpoint import LATEST, CheckpointError, atomic_write_bytes, load_checkpoint, load_model_state
from .engine.hooks import default_hooks, truncate_metrics
from .engine.logging import setup_logging
from .engine.optimizer import build_optimizer
from .engine.trainer import ClsTrainer, NonFiniteLossError

__all__ = ["train", "main"]


def seed_all(seed):
    random.seed(seed)
    np.random.seed(seed % 2**32)
    mge.random.seed(seed)


def _broadcast_params(model):
    if dist.get_world_size() > 1:
        for p in list(model.parameters()) + list(model.buffers()):
            p._reset(dist.broadcast(p, src=0))


def _save_config(cfg, run_dir):
    if dist.is_main_process():
        atomic_write_bytes(os.path.join(run_dir, "config.json"), json.dumps(cfg.to_dict(), indent=2, default=str).encode())
        atomic_write_bytes(os.path.join(run_dir, "config_diff.json"),
                           json.dumps(config_diff(cfg), indent=2, default=str).encode())


def train(cfg, resume=False):
    """Train with resolved config `cfg`; returns the last evaluation's metrics dict."""
    dist.init("auto")
    run_dir = cfg.output_dir
    setup_logging(run_dir)
    world = dist.get_world_size()
    logger.info(f"run directory {run_dir}, {world} process(es), backend {dist.backend()}")
    logger.info("config differs from the defaults in: " + json.dumps(config_diff(cfg), default=str))
    seed_all(cfg.seed)
    if cfg.amp.enabled and not mge.is_cuda_available():
        logger.warning("amp.enabled needs a GPU; training in float32 on the CPU")
        cfg.amp.enabled = False

    train_ds, train_loader = build_data(cfg, train=True)
    test_ds, test_loader = build_data(cfg, train=False)
    if len(train_loader) == 0:
        raise ValueError(f"no full batch: {len(train_ds)} training samples over {world} process(es) "
                         f"with batch_size={cfg.batch_size}; lower batch_size")
    _, precise_loader = build_data(cfg.clone().merge({"seed": cfg.seed + 1}), train=True)

    model = build_model_from_cfg(cfg, in_channels=train_ds.image_shape[0])
    if cfg.model.weights:
        load_weights(model, cfg.model.weights, allow_new_head=True)
    _broadcast_params(model)
    if cfg.bn.efficient_conv_bn_eval:
        from .layers import enable_efficient_conv_bn_eval

        enable_efficient_conv_bn_eval(model, example_input=mge.tensor(example_input(train_ds)))

    base_lr = cfg.solver.basic_lr * world  # linear scaling rule, as basecls
    optimizer = build_optimizer(model, cfg.solver, base_lr)
    gm = GradManager().attach(model.parameters())
    scaler = mge.amp.GradScaler(init_scale=65536.0 if cfg.amp.dynamic_scale else 128.0,
                                growth_interval=2000 if cfg.amp.dynamic_scale else 0) if cfg.amp.enabled else None
    ema = None
    if cfg.model_ema.enabled:
        from .engine.ema import ModelEMA, pycls_momentum

        c = cfg.model_ema
        momentum = c.momentum if c.alpha is None else pycls_momentum(
            c.alpha, cfg.batch_size * world, cfg.solver.max_epoch, c.update_period)
        ema = ModelEMA(model, momentum=momentum, copy_buffers=c.copy_buffers)
        logger.info(f"model EMA momentum {momentum:.6f}, update every {c.update_period} iteration(s)")

    hooks = default_hooks(cfg, base_lr, run_dir, test_loader, precise_loader)
    trainer = ClsTrainer(cfg, model, train_loader, optimizer, gm, hooks=hooks, ema=ema, grad_scaler=scaler)
    trainer.best_top1 = None
    start_epoch = 1
    if resume:
        start_epoch = _resume(trainer, run_dir)
    _save_config(cfg, run_dir)
    if start_epoch > cfg.solver.max_epoch:
        logger.info(f"{run_dir} already finished {cfg.solver.max_epoch} epochs; nothing to resume")
        return None
    trainer.train(start_info=[start_epoch, 1], max_info=[cfg.solver.max_epoch, len(train_loader)])
    return trainer.last_metrics


def _resume(trainer, run_dir):
    path = os.path.join(run_dir, LATEST)
    if not os.path.isfile(path):
        raise CheckpointError(f"--resume: no {LATEST} in {run_dir!r}; start without --resume "
                              f"(or set output_dir to the run you want to continue)")
    ckpt = load_checkpoint(path)
    load_model_state(trainer.model, ckpt["model"], source=path)
    trainer.load_optimizer_state(ckpt["optimizer"])
    if trainer.ema is not None and ckpt.get("ema"):
        trainer.ema.load_state_dict(ckpt["ema"])
    trainer.best_top1 = ckpt.get("best_top1")
    np.random.set_state(ckpt["rng"]["numpy"])
    random.setstate(ckpt["rng"]["python"])
    truncate_metrics(run_dir, ckpt["epoch"]) if dist.is_main_process() else None
    logger.info(f"resumed from {path} after epoch {ckpt['epoch']}")
    return ckpt["epoch"] + 1


def _parse(argv):
    p = argparse.ArgumentParser(prog="python -m basebn.train", description=__doc__.split("\n")[0])
    p.add_argument("config", help="experiment file, e.g. configs/quickstart.py")
    p.add_argument("overrides", nargs="*", help="KEY=VALUE config overrides, e.g. solver.max_epoch=3")
    p.add_argument("--resume", action="store_true", help="continue the run in output_dir from its latest.pkl")
    p.add_argument("--devices", type=int, default=1, help="GPU processes to launch (CPU: use mpiexec -n N)")
    return p.parse_intermixed_args(argv)


def _worker(config, overrides, resume):
    return train(load_config(config, overrides), resume=resume)


@user_errors_exit
def main(argv=None):
    args = _parse(argv)
    cfg = load_config(args.config, args.overrides)  # fail on bad keys before anything starts
    try:
        if args.devices > 1:
            if not mge.is_cuda_available():
                print("error: --devices needs GPUs; on CPU run: mpiexec -n N python -m basebn.train CONFIG ...",
                      file=sys.stderr)
                return 2
            from megengine.distributed import launcher

            launcher(_worker, n_gpus=args.devices)(args.config, args.overrides, args.resume)
        else:
            train(cfg, resume=args.resume)
    except NonFiniteLossError as exc:
        logger.error(str(exc))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
