"""The one weights resolver: a spec -> model state, and loading it into a model.

A spec is `zoo:NAME` (a zoo entry, sha256-verified), a checkpoint or weights file (.npz, or a legacy .pkl read
without running code), or a run directory (its final checkpoint, else its latest).
"""
import megengine.module as M
import numpy as np
from loguru import logger

from ..checkpoint import CheckpointError, load_checkpoint, load_model_state, resolve_weights
from ..zoo import load_zoo_weights

__all__ = ["ZOO_PREFIX", "zoo_name", "read_weights", "load_weights", "resized_classifier_keys"]

ZOO_PREFIX = "zoo:"


def zoo_name(spec):
    """NAME for `zoo:NAME`, None for any other spec."""
    return spec[len(ZOO_PREFIX):] if isinstance(spec, str) and spec.startswith(ZOO_PREFIX) else None


def read_weights(spec, ema=False):
    """-> (model state as a numpy dict, source description); the EMA weights with ema=True."""
    name = zoo_name(spec)
    if name is not None:
        return load_zoo_weights(name, ema=ema), f"{spec} (EMA)" if ema else spec
    path = resolve_weights(spec)
    ckpt = load_checkpoint(path)
    if ema:
        if not ckpt.get("ema"):
            raise CheckpointError(f"{path!r} holds no EMA weights (was model_ema.enabled=True?)")
        return ckpt["ema"]["module"], f"{path} (EMA)"
    return ckpt["model"], path


def resized_classifier_keys(model, state):
    """Keys of the Linear layers whose output size differs from `state`'s, input size equal: a classifier
    trained for another number of classes (fc, head.fc, head.classifier.6, ...)."""
    own = model.state_dict()
    keys = []
    for name, module in model.named_modules():
        weight = f"{name}.weight"
        if isinstance(module, M.Linear) and weight in state:
            theirs, ours = np.shape(state[weight]), tuple(own[weight].shape)
            if len(theirs) == 2 and theirs[1] == ours[1] and theirs[0] != ours[0]:
                keys += [k for k in (weight, f"{name}.bias") if k in own]
    return keys


def load_weights(model, spec, ema=False, allow_new_head=False):
    """Load weights into `model`; with allow_new_head a classifier of another size is left initialised."""
    state, source = read_weights(spec, ema=ema)
    own = model.state_dict()
    if allow_new_head:
        head = resized_classifier_keys(model, state)
        if head:
            logger.warning(f"{source}: classifier shape differs ({', '.join(head)}); keeping a new, initialised head")
            state = {k: v for k, v in state.items() if k not in head}
            state.update({k: np.asarray(own[k]) for k in head})
    load_model_state(model, state, source=source)
    logger.info(f"loaded weights from {source}")
