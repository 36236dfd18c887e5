"""The ``--adapt`` part of ``python -m basebn.test``: options, their checks, the adapted evaluation and the
``--save-adapted`` weights file. The methods themselves are in :mod:`basebn.engine.adapt`.

Multi-process: adabn's statistics (and those written by ``--save-adapted``) are pooled exactly over all
ranks by precise BN's pass; bn_batch normalises each rank's batch (``batch_size`` per process) by its own
statistics; tent runs in one process only (it refuses a multi-process launch with one line).

The ``--save-adapted`` destination is checked before anything runs (a folder that exists and takes a new file, no
file there without ``--force``); a write that still fails at the end raises :class:`AdaptedSaveError`, which
carries the metrics of the finished evaluation.
"""
import dataclasses
import math

from loguru import logger

from .. import distributed as dist
from ..checkpoint import model_state, save_npz_weights
from ..config import ConfigError
from ..utils.cli_args import MAX_LR, bounded_float
from ..utils.fs import new_file_problem
from .adapt import (METHODS, MIN_RELIABLE_BATCH, OPTIMIZERS, evaluate_adapted, prepare_for_adaptation,
                    store_adapted_statistics)

__all__ = ["AdaptOptions", "check_adapt_options", "evaluate_with_adaptation", "add_adapt_arguments",
           "adapt_options_from_args", "AdaptedSaveError"]


class AdaptedSaveError(RuntimeError):
    """The adapted weights could not be written after the evaluation ended; ``metrics`` holds its result."""

    def __init__(self, message, metrics):
        super().__init__(message)
        self.metrics = metrics


@dataclasses.dataclass
class AdaptOptions:
    """What ``--adapt`` and its companion flags ask for (method "none": a plain evaluation)."""

    method: str = "none"
    episodic: bool = False
    lr: float = 1e-3
    steps: int = 1
    optimizer: str = "adam"
    save_to: str = None
    force: bool = False

    @property
    def active(self):
        """Any adaptation, or a file to write, asked for."""
        return self.method != "none" or self.save_to is not None


def add_adapt_arguments(parser):
    """Add --adapt, --episodic, --adapt-lr, --adapt-steps, --adapt-optimizer, --save-adapted, --force."""
    g = parser.add_argument_group("test-time BN adaptation (basebn.engine.adapt)")
    g.add_argument("--adapt", default="none", choices=METHODS,
                   help="none (default); bn_batch: each test batch normalised by its own statistics; adabn: BN "
                        "statistics of the test images first; tent: entropy minimisation of the BN affine "
                        "parameters, one step per batch (the batch size is the config's batch_size)")
    g.add_argument("--episodic", action="store_true", help="tent: reset to the source weights before each batch")
    g.add_argument("--adapt-lr", type=bounded_float(0.0, MAX_LR), default=1e-3,
                   help="tent learning rate (default 1e-3, as TENT)")
    g.add_argument("--adapt-steps", type=int, default=1, help="tent optimizer steps per batch (default 1)")
    g.add_argument("--adapt-optimizer", default="adam", choices=OPTIMIZERS,
                   help="tent optimizer: adam (betas 0.9/0.999, default) or sgd (momentum 0.9, nesterov)")
    g.add_argument("--save-adapted", metavar="OUT.npz", help="write the adapted weights as a basebn weights file")
    g.add_argument("--force", action="store_true", help="let --save-adapted overwrite an existing file")


def adapt_options_from_args(args):
    """:class:`AdaptOptions` of parsed arguments (see :func:`add_adapt_arguments`)."""
    return AdaptOptions(method=args.adapt, episodic=args.episodic, lr=args.adapt_lr, steps=args.adapt_steps,
                        optimizer=args.adapt_optimizer, save_to=args.save_adapted, force=args.force)


def check_adapt_options(options, backend="eager", exported=False):
    """ConfigError (one line) for options that cannot work, before any data is read."""
    o = options
    if o.method not in METHODS:
        raise ConfigError(f"--adapt {o.method!r}: use one of {', '.join(METHODS)}")
    if o.active and (exported or backend != "eager"):
        what = "an exported model file" if exported else f"--backend {backend}"
        raise ConfigError(f"--adapt/--save-adapted need the eager model (BN layers to adapt); {what} is a fixed "
                          f"inference graph: use --backend eager with checkpoint weights")
    if o.method != "tent" and (o.episodic or o.steps != 1 or o.lr != 1e-3 or o.optimizer != "adam"):
        raise ConfigError("--episodic / --adapt-lr / --adapt-steps / --adapt-optimizer apply to --adapt tent only")
    if o.steps < 1:
        raise ConfigError(f"--adapt-steps must be at least 1, got {o.steps}")
    if not (math.isfinite(o.lr) and 0 <= o.lr <= MAX_LR):
        raise ConfigError(f"--adapt-lr must be a finite number in [0, {MAX_LR:g}], got {o.lr}")
    if o.save_to is not None:
        if o.method == "none":
            raise ConfigError("--save-adapted needs an adaptation method: add --adapt bn_batch|adabn|tent")
        if o.episodic:
            raise ConfigError("--save-adapted with --episodic: episodic tent goes back to the source weights before "
                              "every batch, so there are no adapted weights to save; drop --episodic (continual "
                              "tent) or --save-adapted")
        _check_destination(o.save_to, o.force)


def _check_destination(path, force):
    """ConfigError unless `path` can take the adapted weights (utils.fs.new_file_problem)."""
    problem = new_file_problem(path, force)
    if problem:
        raise ConfigError(f"--save-adapted {path!r}: {problem}")


def _save(model, options, meta, metrics):
    if dist.is_main_process():
        try:
            save_npz_weights(options.save_to, model_state(model), meta=meta)
        except OSError as exc:
            raise AdaptedSaveError(f"could not write the {options.method}-adapted weights to {options.save_to!r} "
                                   f"({exc.strerror or exc}); the evaluation finished (its metrics are printed) "
                                   f"and no file was written: fix the folder or free space and run again",
                                   metrics) from exc
        logger.info(f"wrote the {options.method}-adapted weights to {options.save_to}; load them with "
                    f"-w {options.save_to}")


def evaluate_with_adaptation(model, loader, batch_size, options, source="", progress=True):
    """Metrics of ``model`` (loaded weights) on ``loader`` under ``options``; writes ``options.save_to`` when
    set (the adapted weights; for bn_batch / tent with running statistics re-estimated on the test images
    under the adapted weights, so a plain evaluation of the file uses them). `progress`: rank 0 shows the
    batches of each pass (on by default: this is basebn.test's)."""
    if options.method == "tent" and dist.get_world_size() > 1:
        raise ConfigError("--adapt tent runs in one process (each rank would adapt its own copy); run "
                          "basebn.test without a multi-process launcher")
    model = prepare_for_adaptation(model)
    if dist.is_main_process():
        extra = (f", {options.optimizer} lr {options.lr:g}, {options.steps} step(s) per batch"
                 f"{', episodic' if options.episodic else ''}" if options.method == "tent" else "")
        logger.info(f"adapt {options.method}: evaluation batch size {batch_size} per process over "
                    f"{dist.get_world_size()} process(es), test set in its stored order{extra}")
        if options.method in ("bn_batch", "tent") and batch_size < MIN_RELIABLE_BATCH:
            logger.warning(f"adapt {options.method}: each batch is normalised by its own statistics, and batch "
                           f"statistics from {batch_size} image(s) are unreliable (accuracy can fall far below "
                           f"--adapt none); use batch_size={MIN_RELIABLE_BATCH} or more (TENT uses 200)")
    try:
        metrics = evaluate_adapted(model, loader, options.method, lr=options.lr, steps=options.steps,
                                   optimizer=options.optimizer, episodic=options.episodic, progress=progress)
    except ValueError as exc:  # a batch too small for batch statistics (e.g. a last batch of one image)
        if "more than 1 value per channel" not in str(exc):
            raise
        raise ConfigError(f"--adapt {options.method}: a test batch is too small for batch statistics "
                          f"({str(exc).splitlines()[0]}); choose a batch_size that leaves no batch of one image "
                          f"(the last batch holds the remainder of the test set)") from exc
    if options.save_to is not None:
        store_adapted_statistics(model, loader, options.method, progress=progress)
        meta = {"adapted": options.method, "source": str(source), "batch_size": int(batch_size),
                **({"tent": {"lr": options.lr, "steps": options.steps, "optimizer": options.optimizer,
                             "episodic": options.episodic}} if options.method == "tent" else {})}
        _save(model, options, meta, metrics)
    return metrics
