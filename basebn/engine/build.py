"""Config -> objects: datasets, loaders, model (with weights), shared by the train and test CLIs."""
import numpy as np
from loguru import logger

from .. import distributed as dist
from ..data import build_dataset, build_loader, validate_dataset
from ..models import build_model
from .checkpoint import CheckpointError, load_checkpoint, load_model_state, resolve_weights

__all__ = ["build_data", "build_model_from_cfg", "load_weights", "example_input"]


def build_data(cfg, train=True):
    """(dataset, loader) for the train or test split, checked against the config."""
    ds = build_dataset(cfg.data, train=train)
    validate_dataset(ds, cfg.num_classes)
    loader = build_loader(cfg.data, ds, cfg.batch_size, train=train, seed=cfg.seed,
                          rank=dist.get_rank(), world_size=dist.get_world_size())
    return ds, loader


def build_model_from_cfg(cfg, in_channels):
    kw = dict(num_classes=cfg.num_classes, in_channels=in_channels, norm=cfg.model.norm, stem=cfg.model.stem,
              bn_momentum=cfg.bn.momentum, bn_eps=cfg.bn.eps, zero_init_residual=cfg.model.zero_init_residual)
    if cfg.model.stem == "small":
        kw["stem_stride"] = cfg.model.stem_stride
    if cfg.model.base_width is not None:
        kw["base_width"] = cfg.model.base_width
    return build_model(cfg.model.name, **kw)


def example_input(dataset):
    import numpy as np

    return np.zeros((2, *dataset.image_shape), dtype=np.float32)


def read_weights(spec, ema=False):
    """Model state (numpy dict) from a checkpoint file, a run directory, or zoo:NAME."""
    if spec.startswith("zoo:"):
        from ..zoo import load_zoo_weights

        return load_zoo_weights(spec[4:], ema=ema), spec
    path = resolve_weights(spec)
    ckpt = load_checkpoint(path)
    if ema:
        if not ckpt.get("ema"):
            raise CheckpointError(f"{path!r} holds no EMA weights (was model_ema.enabled=True?)")
        return ckpt["ema"]["module"], f"{path} (EMA)"
    return ckpt["model"], path


def load_weights(model, spec, ema=False, allow_new_head=False):
    """Load weights into `model`; with allow_new_head a classifier of another size is left initialised."""
    state, source = read_weights(spec, ema=ema)
    own = model.state_dict()
    if allow_new_head:
        head = [k for k in state if k.startswith("fc.") and k in own and tuple(state[k].shape) != tuple(own[k].shape)]
        if head:
            logger.warning(f"{source}: classifier shape differs ({', '.join(head)}); keeping a new, initialised head")
            state = {k: v for k, v in state.items() if k not in head}
            own_head = {k: np.asarray(own[k]) for k in head}
            state.update(own_head)
    load_model_state(model, state, source=source)
    logger.info(f"loaded weights from {source}")
