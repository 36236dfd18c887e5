"""Config -> objects, the one assembly point: datasets, loaders, model, grad scaler, EMA, trainer, a zoo entry's
config; shared by the train and test CLIs. Every config -> feature switch of a run is here (and in
hooks.default_hooks for the hooks): the objects built get plain arguments and read no config.
"""
import math
from functools import partial
from typing import Any, Callable, Optional, Sequence, Tuple

import numpy as np

import megengine as mge
import megengine.module as M
import megengine.optimizer as optim
from loguru import logger
from megengine.autodiff import GradManager

from .. import distributed as dist
from ..checkpoint import CheckpointError
from ..config import BaseConfig, ConfigError, flatten, load_config
from ..config.recorded import config_mismatches, describe_mismatch, mismatch_refusal, recorded_config
from ..data import DataError, build_dataset, build_loader, validate_dataset
from ..data.errors import NoFullBatchError
from ..layers import enable_efficient_conv_bn_eval, set_norm_batch_size
from ..ops.kernel_autocheck import ensure_kernels_checked
from ..models import RESNET_FAMILIES, ZERO_INIT_FAMILIES, build_model, load_weights, model_info
from ..models.weights import zoo_name
from ..zoo import zoo_config_source
from .ema import ModelEMA, pycls_momentum
from .losses import build_loss
from .trainer import ClsTrainer

__all__ = ["build_data", "test_batch_size", "build_train_data", "build_precise_bn_data", "build_precise_bn_loader",
           "precise_bn_batch_size", "build_model_from_cfg", "build_train_model", "scaled_base_lr", "build_grad_scaler",
           "build_ema", "build_grad_clip", "build_trainer", "example_input", "zoo_config", "resolve_config",
           "load_trained", "check_input_size"]


def zoo_config(name: str, overrides: Sequence[str] = ()) -> BaseConfig:
    """The resolved config of zoo entry `name`: its config file + its overrides + `overrides`.

    Args:
        name: a zoo entry.
        overrides: ``key=value`` strings applied last.
    """
    path, entry_overrides = zoo_config_source(name)
    return load_config(path, entry_overrides + list(overrides))


def build_data(cfg: BaseConfig, train: bool = True) -> Tuple[Any, Any]:
    """(dataset, loader) for the train or test split, checked against the config.

    Args:
        cfg: the config.
        train: the training split (augmented, shuffled, batch_size) rather than the test split (test_batch_size,
            else batch_size).

    Raises:
        DataError: the data is missing or does not fit the config.
    """
    ds = build_dataset(cfg.data, train=train)
    validate_dataset(ds, cfg.num_classes)
    batch_size = cfg.batch_size if train else test_batch_size(cfg)
    loader = build_loader(cfg.data, ds, batch_size, train=train, seed=cfg.seed,
                          rank=dist.get_rank(), world_size=dist.get_world_size(),
                          num_classes=cfg.num_classes, label_smoothing=cfg.loss.label_smooth)
    return ds, loader


def test_batch_size(cfg: BaseConfig) -> int:
    """Images per batch of the test split: test_batch_size, else batch_size.

    Args:
        cfg: the config.

    Returns:
        The batch size of evaluation and of basebn.test (its --adapt methods included), per process.
    """
    return cfg.test_batch_size or cfg.batch_size


def build_train_data(cfg: BaseConfig) -> Tuple[Any, Any]:
    """(dataset, loader) of the training split.

    Args:
        cfg: the config.

    Raises:
        DataError: as build_data, or a split too small for one full batch.
    """
    ds, loader = build_data(cfg, train=True)
    if len(loader) == 0:
        raise DataError(f"no full batch: {len(ds)} training samples over {dist.get_world_size()} process(es) "
                        f"with batch_size={cfg.batch_size}; lower batch_size")
    return ds, loader


def precise_bn_batch_size(cfg: BaseConfig) -> int:
    """Images per batch of the precise-BN pass: bn.precise_batch_size, else the size training normalised
    with (bn.norm_batch_size, else batch_size), so that batch_average estimates at the trained size.

    Args:
        cfg: the config.
    """
    return cfg.bn.precise_batch_size or cfg.bn.norm_batch_size or cfg.batch_size


def _precise_bn_batch_key(cfg):
    """The config key precise_bn_batch_size takes its value from."""
    if cfg.bn.precise_batch_size:
        return "bn.precise_batch_size"
    return "bn.norm_batch_size" if cfg.bn.norm_batch_size else "batch_size"


def build_precise_bn_data(cfg: BaseConfig, seed: Optional[int] = None) -> Tuple[Any, Any]:
    """(dataset, loader) of a precise-BN pass: the training split, augmented, in i.i.d. batches (class batches off:
    the pass estimates population statistics) of precise_bn_batch_size.

    Args:
        cfg: the config.
        seed: the loader's seed; None: cfg.seed.

    Raises:
        DataError: a split without one such batch per process (naming the key the batch size comes from).
    """
    size = precise_bn_batch_size(cfg)
    try:
        return build_data(cfg.clone().merge({"seed": cfg.seed if seed is None else seed, "batch_size": size,
                                             "data": {"classes_per_batch": 0, "examples_per_class": None}}),
                          train=True)
    except NoFullBatchError as exc:
        key = _precise_bn_batch_key(cfg)
        raise DataError(f"{key}={size}: precise BN draws full batches of {size} training images, the training split "
                        f"has {exc.samples} per process ({dist.get_world_size()} process(es)); lower {key}") from None


def build_precise_bn_loader(cfg: BaseConfig) -> Optional[Any]:
    """The precise-BN loader (build_precise_bn_data's, seed + 1), or None when precise BN is off:
    bn.precise_every_n_epoch inf, or bn.norm_eval (fine-tuning keeps the BN statistics it started from).

    Args:
        cfg: the config.
    """
    if cfg.bn.precise_every_n_epoch == math.inf:
        return None
    if cfg.bn.norm_eval:
        logger.info("precise BN off: bn.norm_eval keeps BN statistics frozen")
        return None
    return build_precise_bn_data(cfg, seed=cfg.seed + 1)[1]


def build_model_from_cfg(cfg: BaseConfig, in_channels: int) -> M.Module:
    """The model cfg.model names, with the BN settings of cfg.bn, for images of `in_channels` channels.

    bn.momentum/bn.eps None reach the constructor, whose norm_factory fills in the family's defaults (e.g.
    EfficientNet's). The stem and width keys go to basebn's ResNets only, zero_init_residual (None: the
    family's default) to the families whose blocks end in a norm; config/checks.py refuses them elsewhere.

    Args:
        cfg: the config.
        in_channels: channels of the images.
    """
    kw = dict(num_classes=cfg.num_classes, in_channels=in_channels, norm=cfg.model.norm,
              bn_momentum=cfg.bn.momentum, bn_eps=cfg.bn.eps)
    family = model_info(cfg.model.name)["family"]
    if family in RESNET_FAMILIES:
        kw.update(stem=cfg.model.stem, stem_stride=cfg.model.stem_stride)
        if cfg.model.base_width is not None:
            kw["base_width"] = cfg.model.base_width
    if family in ZERO_INIT_FAMILIES and cfg.model.zero_init_residual is not None:
        kw["zero_init_residual"] = cfg.model.zero_init_residual
    ensure_kernels_checked()  # the kernels' quick self-check (cached); a family that disagrees falls back
    return build_model(cfg.model.name, **kw)


def build_train_model(cfg: BaseConfig, dataset: Any) -> M.Module:
    """The model to train on `dataset`: built, model.weights loaded (a new head allowed), the same on every
    rank, efficient conv-BN eval when bn.efficient_conv_bn_eval, ghost BN groups of bn.norm_batch_size.

    Args:
        cfg: the config.
        dataset: the training dataset (its image shape).
    """
    model = build_model_from_cfg(cfg, in_channels=dataset.image_shape[0])
    check_input_size(model, dataset.image_shape, cfg.model.name)
    if cfg.bn.norm_batch_size is not None:
        set_norm_batch_size(model, cfg.bn.norm_batch_size)
    if cfg.model.weights:
        load_weights(model, cfg.model.weights, allow_new_head=True)
    if dist.get_world_size() > 1:  # rank 0's initialisation everywhere
        for p in list(model.parameters()) + list(model.buffers()):
            p._reset(dist.broadcast(p, src=0))
    if cfg.bn.efficient_conv_bn_eval:
        enable_efficient_conv_bn_eval(model, example_input=mge.tensor(example_input(dataset)))
    return model


def scaled_base_lr(cfg: BaseConfig) -> float:
    """solver.basic_lr * world size: the linear scaling rule, as basecls.

    Args:
        cfg: the config.
    """
    return cfg.solver.basic_lr * dist.get_world_size()


def build_grad_scaler(cfg: BaseConfig) -> Optional[Any]:
    """megengine.amp.GradScaler for amp.enabled (dynamic or fixed scale), else None. Without a GPU amp is
    turned off in `cfg` (config.json then records the float32 run) with a warning.

    Args:
        cfg: the config.
    """
    if not cfg.amp.enabled:
        return None
    if not mge.is_cuda_available():
        logger.warning("amp.enabled needs a GPU; training in float32 on the CPU")
        cfg.amp.enabled = False
        return None
    dynamic = cfg.amp.dynamic_scale
    return mge.amp.GradScaler(init_scale=65536.0 if dynamic else 128.0, growth_interval=2000 if dynamic else 0)


def build_ema(cfg: BaseConfig, model: M.Module) -> Optional[ModelEMA]:
    """ModelEMA of `model` for model_ema.enabled, else None. Momentum: model_ema.momentum, or from
    model_ema.alpha by pycls's rule over the total batch size, the epochs and the update period.

    Args:
        cfg: the config.
        model: the model to average.
    """
    c = cfg.model_ema
    if not c.enabled:
        return None
    momentum = c.momentum if c.alpha is None else pycls_momentum(
        c.alpha, cfg.batch_size * dist.get_world_size(), cfg.solver.max_epoch, c.update_period)
    logger.info(f"model EMA momentum {momentum:.6f}, update every {c.update_period} iteration(s)")
    return ModelEMA(model, momentum=momentum, copy_buffers=c.copy_buffers)


def build_grad_clip(clip: Any) -> Optional[Callable[..., Any]]:
    """``params -> None`` clipping gradients as the solver.grad_clip section `clip` says, or None (off).

    Args:
        clip: the config's solver.grad_clip section.
    """
    if clip.name == "norm":
        return partial(optim.clip_grad_norm, max_norm=clip.max_norm)
    if clip.name == "value":
        return partial(optim.clip_grad_value, lower=clip.lower, upper=clip.upper)
    return None


def build_trainer(cfg: BaseConfig, model: M.Module, train_loader: Any, optimizer: optim.Optimizer,
                  hooks: Sequence[Any] = (), ema: Optional[ModelEMA] = None, grad_scaler: Optional[Any] = None,
                  record: Optional[Any] = None) -> ClsTrainer:
    """ClsTrainer for `model` (a GradManager attached to its parameters) with cfg's loss, AMP (on when
    `grad_scaler` is given), accumulation, clipping, trace and bn.norm_eval; cfg is recorded in checkpoints.

    Args:
        cfg: the config.
        model: the model to train.
        train_loader: the training loader.
        optimizer: the optimizer over the model's parameters.
        hooks: the trainer's hooks.
        ema: the EMA to update, or None.
        grad_scaler: an AMP GradScaler (build_grad_scaler), or None.
        record: the run record the hooks fill, or None.
    """
    return ClsTrainer(model, train_loader, optimizer, GradManager().attach(model.parameters()), build_loss(cfg),
                      hooks=list(hooks), ema=ema, grad_scaler=grad_scaler, record=record,
                      amp=grad_scaler is not None, accumulation_steps=cfg.solver.accumulation_steps,
                      clip_grads=build_grad_clip(cfg.solver.grad_clip), trace=cfg.trace, norm_eval=cfg.bn.norm_eval,
                      config=cfg, bn_accumulation_aware=cfg.bn.accumulation_aware)


def example_input(dataset: Any) -> np.ndarray:
    """A zero batch of two images shaped like `dataset`'s, for tracing the model.

    Args:
        dataset: a dataset with an ``image_shape``.
    """
    return np.zeros((2, *dataset.image_shape), dtype=np.float32)


def resolve_config(spec: str, overrides: Sequence[str], weights: Optional[str]) -> Tuple[BaseConfig, str]:
    """(cfg, weights spec) for CONFIG.py + -w WEIGHTS, or for zoo:NAME (its own config and weights).

    Args:
        spec: a config file or zoo:NAME.
        overrides: ``key=value`` strings.
        weights: the weights spec; None takes zoo:NAME's own.

    Raises:
        ConfigError: a config file without weights.
    """
    if zoo_name(spec) is not None:
        return zoo_config(zoo_name(spec), overrides), weights or spec
    if not weights:
        raise ConfigError("no weights: pass -w CHECKPOINT|RUN_DIR|zoo:NAME "
                          "(basebn.test also takes MODEL.mge|MODEL.onnx)")
    return load_config(spec, overrides), weights


def load_trained(cfg: BaseConfig, weights: str, ema: bool = False) -> Tuple[M.Module, Any, Any]:
    """(model with `weights` loaded, test dataset, test loader) for config `cfg`. Where cfg differs from the config
    the weights record on a key that changes results (config/recorded.py), weights that do not fit are refused in
    one line naming the recorded values, and weights that fit load with one warning line per key.

    Args:
        cfg: the config.
        weights: a weights spec.
        ema: the checkpoint's EMA weights.

    Raises:
        CheckpointError: weights that cannot be read or do not fit.
    """
    dist.init("auto")
    ds, loader = build_data(cfg, train=False)
    model = build_model_from_cfg(cfg, in_channels=ds.image_shape[0])
    check_input_size(model, ds.image_shape, cfg.model.name)
    mismatches = config_mismatches(flatten(cfg), recorded_config(weights))
    try:
        load_weights(model, weights, ema=ema)
    except CheckpointError:
        if mismatches:  # the recorded config says why, where the key lists would not
            raise CheckpointError(mismatch_refusal(weights, mismatches)) from None
        raise
    for key, recorded, given in mismatches:
        logger.warning(describe_mismatch(weights, key, recorded, given))
    return model, ds, loader


def _forward_error(model, image_shape):
    """None when `model` (eval mode, flags restored) runs on two zero images of `image_shape`, else the error."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        model(mge.tensor(np.zeros((2, *image_shape), np.float32))).numpy()
        return None
    except (RuntimeError, ValueError, AssertionError, IndexError) as exc:  # MegEngine's shape checks, model code
        return exc
    finally:
        for m, training in modes:
            m.training = training


def check_input_size(model: M.Module, image_shape: Sequence[int], name: str) -> None:
    """Refuse images too small for `model`.

    Args:
        model: the model.
        image_shape: (C, H, W).
        name: the model's name, for the message.

    Raises:
        ConfigError: naming the size, when `model` cannot run on images of `image_shape` but runs on 224 x 224
            ones (a VGG or HRNet on 28 px images); any other failure is raised as it is.
    """
    error = _forward_error(model, image_shape)
    if error is None:
        return
    c, h, w = image_shape
    if _forward_error(model, (c, 224, 224)) is not None:
        raise error
    reason = str(error).strip().splitlines()[0][:200]
    raise ConfigError(f"model {name} cannot run on {h}x{w} images ({reason}); give it larger images "
                      f"(data.image_size, e.g. 224; or --input-size for basebn.deploy) or choose another model")
