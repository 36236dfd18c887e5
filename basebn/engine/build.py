"""Config -> objects: datasets, loaders, model, a zoo entry's config; shared by the train and test CLIs."""
import numpy as np

from .. import distributed as dist
from ..config import ConfigError, load_config
from ..data import build_dataset, build_loader, validate_dataset
from ..models import build_model, load_weights, model_info
from ..models.weights import zoo_name
from ..zoo import zoo_config_source

__all__ = ["build_data", "build_model_from_cfg", "example_input", "zoo_config", "resolve_config", "load_trained"]


def zoo_config(name, overrides=()):
    """The resolved config of zoo entry `name`: its config file + its overrides + `overrides`."""
    path, entry_overrides = zoo_config_source(name)
    return load_config(path, entry_overrides + list(overrides))


def build_data(cfg, train=True):
    """(dataset, loader) for the train or test split, checked against the config."""
    ds = build_dataset(cfg.data, train=train)
    validate_dataset(ds, cfg.num_classes)
    loader = build_loader(cfg.data, ds, cfg.batch_size, train=train, seed=cfg.seed,
                          rank=dist.get_rank(), world_size=dist.get_world_size(),
                          num_classes=cfg.num_classes, label_smoothing=cfg.loss.label_smooth)
    return ds, loader


# families built by basebn's ResNet class, the only ones that take model.stem/stem_stride/base_width
_RESNET_FAMILIES = ("resnet", "cifar_resnet")


def build_model_from_cfg(cfg, in_channels):
    """The model cfg.model names, with the BN settings of cfg.bn, for images of `in_channels` channels.

    bn.momentum/bn.eps None keep the family's own defaults (e.g. EfficientNet's); the stem and width keys
    apply to basebn's ResNets only.
    """
    kw = dict(num_classes=cfg.num_classes, in_channels=in_channels, norm=cfg.model.norm,
              bn_momentum=cfg.bn.momentum, bn_eps=cfg.bn.eps)
    if model_info(cfg.model.name)["family"] in _RESNET_FAMILIES:
        kw.update(stem=cfg.model.stem, zero_init_residual=cfg.model.zero_init_residual)
        if cfg.model.stem == "small":
            kw["stem_stride"] = cfg.model.stem_stride
        if cfg.model.base_width is not None:
            kw["base_width"] = cfg.model.base_width
    return build_model(cfg.model.name, **kw)


def example_input(dataset):
    """A zero batch of two images shaped like `dataset`'s, for tracing the model."""
    return np.zeros((2, *dataset.image_shape), dtype=np.float32)


def resolve_config(spec, overrides, weights):
    """(cfg, weights spec) for CONFIG.py + -w WEIGHTS, or for zoo:NAME (its own config and weights)."""
    if zoo_name(spec) is not None:
        return zoo_config(zoo_name(spec), overrides), weights or spec
    if not weights:
        raise ConfigError("no weights: pass -w CHECKPOINT|RUN_DIR|zoo:NAME "
                          "(basebn.test also takes MODEL.mge|MODEL.onnx)")
    return load_config(spec, overrides), weights


def load_trained(cfg, weights, ema=False):
    """(model with `weights` loaded, test dataset, test loader) for config `cfg`."""
    dist.init("auto")
    ds, loader = build_data(cfg, train=False)
    model = build_model_from_cfg(cfg, in_channels=ds.image_shape[0])
    load_weights(model, weights, ema=ema)
    return model, ds, loader
