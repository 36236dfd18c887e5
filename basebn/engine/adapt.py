"""Test-time BN adaptation of a trained model (no trainer): test-batch statistics, AdaBN and TENT.

Each method takes a model and an iterable of image batches (numpy or Tensors; ``(images, labels)`` tuples
accepted, labels never read) and yields each batch's logits (numpy), in order. ``bn_batch``: each batch
normalised by its own statistics (TENT's "norm"); ``adabn``: BN statistics of the evaluated images (precise
BN's pass, exact over ranks), then eval; ``tent``: as DequanWang/tent's tent.py (model in train mode, BN on
batch statistics, BN affine trained on the mean softmax entropy, the logits of the last update's forward,
``episodic`` resets). Call :func:`prepare_for_adaptation` first. Semantics in detail: docs/bn_adaptation.md.

A batch whose images hold a NaN or inf adapts nothing: adabn leaves it out of the statistics, tent makes no update
on it (nor on a batch whose entropy gradient is non-finite: γ/β and the optimizer state stay as they were),
bn_batch and tent evaluate it in eval mode with the running statistics and the current weights. Each method
logs one warning with the count of such batches.
"""
import contextlib
import math
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple

import numpy as np
from loguru import logger

import megengine as mge
import megengine.functional as F
import megengine.module as M
import megengine.optimizer as optim
from megengine.autodiff import GradManager

from .. import distributed as dist
from ..config import ConfigError
from ..layers import convert_to_batchnorm, disable_efficient_conv_bn_eval, revert_sync_batchnorm, update_bn_stats
from ..layers.norm import is_bn2d, is_frozen_bn
from ..utils.progress import progress_bar
from .evaluate import score_predictions
from .finite import all_finite

__all__ = ["METHODS", "OPTIMIZERS", "prepare_for_adaptation", "adaptable_bn_layers", "predict", "bn_batch_predict",
           "adapt_bn_statistics", "adabn", "tent", "softmax_entropy", "adapt_predictions", "evaluate_adapted",
           "store_adapted_statistics", "MIN_RELIABLE_BATCH"]

METHODS = ("none", "bn_batch", "adabn", "tent")
"""The adaptation methods adapt_predictions takes (``basebn.test --adapt``)."""
OPTIMIZERS = ("adam", "sgd")
"""The optimizers TENT takes."""
MIN_RELIABLE_BATCH = 16  # below this many images per batch, batch statistics are too noisy to normalise with
"""Images per batch below which batch statistics are too noisy to normalise with (bn_batch and tent warn)."""


def prepare_for_adaptation(model: M.Module) -> M.Module:
    """``model`` ready for adaptation: efficient conv-BN switched off, SyncBatchNorm reverted to local BN,
    FrozenBatchNorm2d converted back to a trainable BatchNorm2d, and every BN layer's ``freeze`` flag cleared
    (the adapted layers must see their inputs).

    Args:
        model: the model, converted in place where possible.

    Returns:
        The model to adapt (`model`, or its replacement when `model` is itself a BN layer).
    """
    disable_efficient_conv_bn_eval(model)
    model = revert_sync_batchnorm(model)
    model = convert_to_batchnorm(model)
    for _, m in adaptable_bn_layers(model):
        if getattr(m, "freeze", False):
            m.freeze = False
    return model


def adaptable_bn_layers(model: M.Module) -> List[Tuple[str, M.Module]]:
    """``[(name, module)]`` of the BN layers the methods adapt: every 2D BN layer but FrozenBatchNorm2d.

    Args:
        model: the model.
    """
    return [(name, m) for name, m in model.named_modules() if is_bn2d(m) and not is_frozen_bn(m)]


def _check_has_bn(layers, method):
    """ConfigError when there is no BN layer for `method` to adapt (a GroupNorm / LayerNorm model)."""
    if not layers:
        raise ConfigError(f"{method} needs BN layers to adapt; this model has none (its norm layers are not "
                          f"BatchNorm2d): evaluate it without --adapt")


def _raw_images(batch):
    """The images of a batch as given: a tuple/list's first element, else the batch."""
    return batch[0] if isinstance(batch, (tuple, list)) else batch


def _images(batch):
    """The images of a batch (a tuple/list's first element, else the batch) as a float32 Tensor."""
    batch = _raw_images(batch)
    if isinstance(batch, mge.Tensor):
        return batch
    return mge.tensor(np.asarray(batch, dtype=np.float32))


def _all_finite(images):
    """Whether `images` (numpy, or a Tensor: one device reduction) hold no NaN or inf."""
    if isinstance(images, mge.Tensor):
        return bool(F.sum(images * 0).item() == 0)  # x * 0 is NaN exactly where x is NaN or inf
    return bool(np.isfinite(np.asarray(images)).all())


def _finite_images(batch):
    """``(images as a Tensor, whether they hold no NaN or inf)`` of a batch."""
    return _images(batch), _all_finite(_raw_images(batch))


class _NonFiniteBatches:
    """The count of the batches a method adapts nothing on (NaN or inf), logged in one warning by :meth:`report`."""

    def __init__(self, method, outcome):
        self.method, self.outcome = method, outcome
        self.seen = self.skipped = 0

    def see(self, finite):
        """Count one batch; returns `finite`."""
        self.seen += 1
        self.skipped += not finite
        return finite

    def report(self):
        """One warning with the count, when a batch was non-finite."""
        if self.skipped:
            logger.warning(f"adapt {self.method}: {self.skipped} of {self.seen} batch(es) held NaN or inf values: "
                           f"{self.outcome}")


class _FiniteBatches:
    """Re-iterable view of `batches` without those whose images hold NaN or inf (counted by `tally`)."""

    def __init__(self, batches, tally):
        self.batches, self.tally = batches, tally

    def __iter__(self):
        for batch in self.batches:
            if self.tally.see(_all_finite(_raw_images(batch))):
                yield batch


def _eval_logits(model, layers, tracks, images):
    """Logits of `images` in eval mode with the running statistics (for a batch whose own statistics are
    non-finite); every module's training flag and the layers' batch-statistics flags are put back after."""
    flags = [(m, m.training) for m in model.modules()]
    model.eval()
    for (_, m), track in zip(layers, tracks):
        m.track_running_stats = track
    try:
        return model(images).numpy()
    finally:
        for m, training in flags:
            m.training = training
        for _, m in layers:
            m.track_running_stats = False


@contextlib.contextmanager
def _kept_state(model, layers):
    """Every module's training flag, and each layer's track_running_stats / freeze / running statistics,
    restored after the block."""
    flags = [(m, m.training) for m in model.modules()]
    saved = [(m, m.track_running_stats, getattr(m, "freeze", False)) for _, m in layers]
    stats = [(m, m.running_mean.numpy().copy(), m.running_var.numpy().copy()) for _, m in layers
             if m.running_mean is not None and m.running_var is not None]
    try:
        yield
    finally:
        for m, training in flags:
            m.training = training
        for m, track, freeze in saved:
            m.track_running_stats = track
            if hasattr(m, "freeze"):
                m.freeze = freeze
        for m, mean, var in stats:
            m.running_mean[...] = mge.tensor(mean, dtype=m.running_mean.dtype, device=m.running_mean.device)
            m.running_var[...] = mge.tensor(var, dtype=m.running_var.dtype, device=m.running_var.device)


def _use_batch_statistics(layers):
    """Each layer normalises with the statistics of its input batch and updates no running statistics
    (train mode, track_running_stats off, freeze off); the caller restores with :func:`_kept_state`."""
    for _, m in layers:
        m.training = True
        m.track_running_stats = False
        if hasattr(m, "freeze"):
            m.freeze = False


def predict(model: M.Module, batches: Iterable[Any]) -> Iterator[np.ndarray]:
    """Logits of each batch in eval mode (running statistics), as numpy arrays; flags restored after.

    Args:
        model: the model.
        batches: images, ``(images, labels, ...)`` tuples or dicts with an ``"image(s)"`` key.

    Returns:
        A generator of each batch's logits.
    """
    with _kept_state(model, []):
        model.eval()
        for batch in batches:
            yield model(_images(batch)).numpy()


def bn_batch_predict(model: M.Module, batches: Iterable[Any]) -> Iterator[np.ndarray]:
    """Logits of each batch with every BN layer normalising it by its own statistics (test-batch BN, TENT's
    "norm"); everything else in eval mode. Weights and running statistics are left as they were.

    Args:
        model: the model.
        batches: batches as :func:`predict` takes them.

    Returns:
        A generator of each batch's logits.

    Raises:
        ConfigError: the model has no BN layer to adapt (on the first batch).
    """
    layers = adaptable_bn_layers(model)
    _check_has_bn(layers, "bn_batch")
    tracks = [m.track_running_stats for _, m in layers]
    tally = _NonFiniteBatches("bn_batch", "evaluated with the running statistics instead of their own")
    with _kept_state(model, layers):
        model.eval()
        _use_batch_statistics(layers)
        try:
            for batch in batches:
                images, finite = _finite_images(batch)
                yield model(images).numpy() if tally.see(finite) else _eval_logits(model, layers, tracks, images)
        finally:
            tally.report()


def adapt_bn_statistics(model: M.Module, batches: Iterable[Any], num_samples: Optional[int] = None,
                        method: str = "pooled", progress: bool = False) -> Dict[str, Any]:
    """AdaBN's step: every BN layer's running statistics become the population statistics of the images of
    ``batches`` (precise BN's pass, :func:`basebn.layers.update_bn_stats`: pooled over batches and exact over
    ranks; every rank must call it). Batches whose images hold NaN or inf are left out (one warning counts
    them).

    Args:
        model: the model.
        batches: batches as :func:`predict` takes them.
        num_samples: images to use over all ranks; None: all.
        method: ``"pooled"`` or ``"batch_average"`` (update_bn_stats's).
        progress: show the pass's batches and update_bn_stats's summary line (rank 0).

    Returns:
        update_bn_stats's summary.
    """
    tally = _NonFiniteBatches("adabn", "left out of the BN statistics")
    try:
        return update_bn_stats(model, _FiniteBatches(batches, tally), num_samples=num_samples, method=method,
                               progress=progress)
    finally:
        tally.report()


def _reiterable(batches, what):
    if iter(batches) is batches:
        raise TypeError(f"{what} passes over the batches twice: give a list or a loader, not an iterator")


def adabn(model: M.Module, batches: Iterable[Any], num_samples: Optional[int] = None,
          method: str = "pooled", progress: bool = False) -> Iterator[np.ndarray]:
    """AdaBN: :func:`adapt_bn_statistics` over ``batches``, then the logits of each batch in eval mode. The new
    statistics stay in the model.

    Args:
        model: the model.
        batches: batches as :func:`predict` takes them; re-iterable (a list or a loader).
        num_samples: images the statistics come from (the first ones); None: all.
        method: ``"pooled"`` or ``"batch_average"``.
        progress: show the statistics pass's batches (rank 0).

    Returns:
        A generator of each batch's logits.

    Raises:
        TypeError: `batches` is an iterator (it is read twice).
        ConfigError: the model has no BN layer to adapt.
    """
    _reiterable(batches, "adabn")
    _check_has_bn(adaptable_bn_layers(model), "adabn")
    adapt_bn_statistics(model, batches, num_samples=num_samples, method=method, progress=progress)
    yield from predict(model, batches)


def softmax_entropy(logits: mge.Tensor) -> mge.Tensor:
    """Per-sample entropy of softmax(logits) along axis 1: ``-sum(p * log p)``.

    Args:
        logits: (N, classes).

    Returns:
        (N,) entropies.
    """
    return -(F.softmax(logits, axis=1) * F.nn.logsoftmax(logits, axis=1)).sum(axis=1)


def _build_optimizer(params, name, lr, betas, weight_decay, momentum, nesterov):
    if name == "adam":
        return optim.Adam(params, lr=lr, betas=tuple(betas), weight_decay=weight_decay)
    if name == "sgd":
        return optim.SGD(params, lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay)
    raise ConfigError(f"unknown adaptation optimizer {name!r}: use one of {', '.join(OPTIMIZERS)}")


def _check_tent_args(steps, lr, params):
    if int(steps) < 1:
        raise ConfigError(f"tent needs at least one step per batch (--adapt-steps), got {steps}")
    if not (math.isfinite(lr) and lr >= 0):
        raise ConfigError(f"the adaptation learning rate must be a finite number >= 0 (--adapt-lr), got {lr}")
    if not params:
        raise ConfigError("tent needs BN layers with affine parameters to adapt; this model has none")
    if dist.get_world_size() > 1:
        raise ConfigError("--adapt tent runs in one process (each rank would adapt its own copy); "
                          "run basebn.test without a multi-process launcher")


def tent(model: M.Module, batches: Iterable[Any], lr: float = 1e-3, steps: int = 1, optimizer: str = "adam",
         betas: Tuple[float, float] = (0.9, 0.999), weight_decay: float = 0.0, episodic: bool = False,
         momentum: float = 0.9, nesterov: bool = True) -> Iterator[np.ndarray]:
    """TENT: adapt the BN affine parameters by entropy minimisation, one batch at a time; yields the logits
    of each batch from the forward of its last update (see the module doc).

    The adapted affine parameters stay in the model; flags and running statistics are restored after. A
    batch whose images hold NaN or inf is not adapted on and is evaluated in eval mode (running statistics,
    the current γ/β); a step whose gradient is non-finite is skipped (no update, the optimizer state
    unchanged) with the batch's remaining steps.

    Args:
        model: the model.
        batches: batches as :func:`predict` takes them.
        lr: the learning rate.
        steps: updates per batch.
        optimizer: "adam" or "sgd".
        betas: Adam's (TENT's CIFAR-10-C setting by default).
        weight_decay: Adam's weight decay.
        episodic: reset the adapted parameters to the source values and the optimizer to a fresh state
            before every batch.
        momentum: SGD's momentum (TENT's SGD default).
        nesterov: SGD's Nesterov momentum (TENT's SGD default).

    Returns:
        A generator of each batch's logits.

    Raises:
        ConfigError: steps below 1, a negative or non-finite lr, an unknown optimizer, no affine BN layer to
            adapt, or a multi-process job (on the first batch).
    """
    layers = adaptable_bn_layers(model)
    params = [p for _, m in layers if m.affine for p in (m.weight, m.bias)]
    _check_tent_args(steps, lr, params)
    source = [p.numpy().copy() for p in params]
    opt = _build_optimizer(params, optimizer, lr, betas, weight_decay, momentum, nesterov)
    gm = GradManager().attach(params)
    tracks = [m.track_running_stats for _, m in layers]
    tally = _NonFiniteBatches("tent", "not adapted on (BN affine parameters and optimizer state unchanged)")
    with _kept_state(model, layers):
        model.train()  # as TENT's configure_model: the whole model in train mode
        _use_batch_statistics(layers)
        try:
            for batch in batches:
                images, finite = _finite_images(batch)
                if episodic:
                    for p, value in zip(params, source):
                        p._reset(mge.tensor(value, dtype=p.dtype, device=p.device))
                    opt = _build_optimizer(params, optimizer, lr, betas, weight_decay, momentum, nesterov)
                if not finite:
                    tally.see(False)
                    yield _eval_logits(model, layers, tracks, images)
                    continue
                yield _tent_steps(model, images, params, gm, opt, int(steps), tally)
        finally:
            tally.report()


def _tent_steps(model, images, params, gm, opt, steps, tally):
    """``steps`` TENT updates on one batch; the logits of the last forward. A non-finite gradient skips its
    update and the remaining steps (the batch counted in `tally` as non-finite)."""
    for _ in range(steps):
        with gm:
            logits = model(images)
            gm.backward(softmax_entropy(logits).mean())
        if not all_finite([p.grad for p in params if p.grad is not None]):
            opt.clear_grad()
            tally.see(False)
            return logits.numpy()
        opt.step()
        opt.clear_grad()
    tally.see(True)
    return logits.numpy()


def adapt_predictions(model: M.Module, batches: Iterable[Any], method: str, *, num_samples: Optional[int] = None,
                      lr: float = 1e-3, steps: int = 1, optimizer: str = "adam",
                      episodic: bool = False, progress: bool = False) -> Iterator[np.ndarray]:
    """Logits per batch of ``method`` in METHODS ("none": plain eval mode).

    Args:
        model: the model (adapted in place by adabn and tent).
        batches: batches as :func:`predict` takes them.
        method: "none", "bn_batch", "adabn" or "tent".
        num_samples: adabn's images; None: all.
        lr: tent's learning rate.
        steps: tent's updates per batch.
        optimizer: tent's optimizer, "adam" or "sgd".
        episodic: tent resets before every batch.
        progress: show adabn's statistics pass (rank 0).

    Returns:
        An iterator of each batch's logits.

    Raises:
        ConfigError: an unknown method.
    """
    if method == "none":
        return predict(model, batches)
    if method == "bn_batch":
        return bn_batch_predict(model, batches)
    if method == "adabn":
        return adabn(model, batches, num_samples=num_samples, progress=progress)
    if method == "tent":
        return tent(model, batches, lr=lr, steps=steps, optimizer=optimizer, episodic=episodic)
    raise ConfigError(f"unknown adaptation method {method!r}: use one of {', '.join(METHODS)}")


class _LabelTap:
    """Iterates a labelled loader, keeping the labels of the batch handed out last."""

    def __init__(self, loader):
        self.loader = loader
        self.labels = None

    def __iter__(self):
        for images, labels, *_ in self.loader:
            self.labels = np.asarray(labels)
            yield images

    def __len__(self):
        return len(self.loader)


def evaluate_adapted(model: M.Module, loader: Any, method: str, desc: str = "test", progress: bool = False,
                     **options: Any) -> Dict[str, float]:
    """Accuracy and loss of ``method``'s logits on a labelled loader, batches in the loader's order, summed
    over ranks (as :func:`basebn.engine.evaluate.evaluate`). The hard labels of each batch score the logits
    the method yields for it.

    Args:
        model: the model.
        loader: a labelled loader with a length.
        method: "none", "bn_batch", "adabn" or "tent".
        desc: the progress display's label.
        progress: show the batches done of total, and adabn's statistics pass (rank 0; basebn.test passes True).
        **options: to :func:`adapt_predictions`.

    Returns:
        ``{'top1', 'top5', 'loss', 'images'}``.
    """
    tap = _LabelTap(loader)
    logits_iter = adapt_predictions(model, tap, method, progress=progress, **options)
    bar = progress_bar(logits_iter, desc=f"{desc} ({method})", total=len(loader), enabled=progress,
                       rank=dist.get_rank())
    return score_predictions((logits, tap.labels) for logits in bar)


def store_adapted_statistics(model: M.Module, batches: Iterable[Any], method: str,
                             num_samples: Optional[int] = None, progress: bool = False) -> Optional[Dict[str, Any]]:
    """Make the model's running statistics fit what ``method`` normalised with, before saving it as a normal
    weights file: for bn_batch and tent (which normalise with batch statistics and leave the running ones
    as the source's) the population statistics of ``batches`` under the adapted weights (an AdaBN pass);
    adabn's and none's are already in place.

    Args:
        model: the adapted model.
        batches: batches as :func:`predict` takes them.
        method: the method the model was adapted with.
        num_samples: images of the AdaBN pass; None: all.
        progress: show the pass's batches and summary line (rank 0).

    Returns:
        The precise-BN summary, or None (nothing to do).
    """
    if method in ("bn_batch", "tent"):
        return adapt_bn_statistics(model, batches, num_samples=num_samples, progress=progress)
    return None
