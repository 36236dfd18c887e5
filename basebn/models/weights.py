"""The one weights resolver: a spec -> model state, and loading it into a model.

A spec is `zoo:NAME` (a zoo entry, sha256-verified), a checkpoint or weights file (.npz, or a legacy .pkl read
without running code), a run directory (its final checkpoint, else its latest), `basecls:PATH` (an
``mge.save`` pickle of basecls, read by the restricted unpickler), `basecls:NAME` (basecls's published
weights of model NAME, fetched by basecls_fetch, made RGB-input) or `timm:PATH` (a timm / Hugging Face
.safetensors file). The last two need the target model (its ``arch_name`` / ``arch_family``, set by
build_model) to pick the name map of :mod:`basebn.models.convert`.
"""
import os
from typing import Dict, Optional, Tuple

import megengine.module as M
import numpy as np
from loguru import logger
from safetensors import SafetensorError
from safetensors.numpy import load_file as load_safetensors

from ..checkpoint import CheckpointError, load_checkpoint, load_model_state, member_fit, resolve_weights
from ..checkpoint.legacy import load_restricted_pickle
from ..layers.norm import is_bn
from ..zoo import load_zoo_weights
from .basecls_fetch import check_basecls_name, fetch_basecls_weights, is_basecls_name
from .convert import FOREIGN_FORMATS, convert_basecls, convert_timm
from .convert.channel_order import bgr_to_rgb_input

__all__ = ["ZOO_PREFIX", "zoo_name", "foreign_spec", "read_foreign_state", "read_weights", "load_weights",
           "resized_classifier_keys"]

ZOO_PREFIX = "zoo:"
_STATE_PREFIXES = ("model.", "module.")  # an EMA wrapper's state dict may prefix every key
FOREIGN_BN_EPS = 1e-5  # every basecls model's and timm PyTorch port's BN eps (tf_* ports: 1e-3)


def foreign_spec(spec):
    """(format, path) for `timm:PATH` / `basecls:PATH`, None for any other spec."""
    if not isinstance(spec, str):
        return None
    fmt, sep, path = spec.partition(":")
    return (fmt, path) if sep and fmt in FOREIGN_FORMATS else None


def _basecls_state(path, ema):
    """The model (or EMA) state dict of a basecls checkpoint: bare, or under "model" / "state_dict" / "ema"."""
    data = load_restricted_pickle(path)
    if ema:
        if not (isinstance(data, dict) and isinstance(data.get("ema"), dict)):
            raise CheckpointError(f"{path!r} holds no EMA weights (no 'ema' entry)")
        data = data["ema"]
    for key in ("model", "state_dict"):
        if isinstance(data, dict) and isinstance(data.get(key), dict):
            data = data[key]
    if not (isinstance(data, dict) and data and all(isinstance(v, np.ndarray) for v in data.values())):
        raise CheckpointError(f"{path!r} is not a basecls checkpoint (no state dict of arrays found)")
    for prefix in _STATE_PREFIXES:
        if all(k.startswith(prefix) for k in data):
            data = {k[len(prefix):]: v for k, v in data.items()}
    return data


def _timm_state(path, ema):
    if ema:
        raise CheckpointError(f"timm:{path}: a timm .safetensors file holds one set of weights; drop the EMA "
                              f"option (timm saves EMA weights as a file of their own)")
    try:
        return load_safetensors(path)
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"timm:{path} is not a readable .safetensors file ({exc}); timm: takes "
                              f"safetensors only (convert a .pth/.bin with safetensors.torch first)") from exc


def read_foreign_state(spec, model, ema=False):
    """-> (state converted to `model`'s keys and shapes, source) for a `timm:` / `basecls:` spec;
    `basecls:NAME` (no path separator, no such file) fetches basecls's published weights (basecls_fetch)."""
    fmt, path = foreign_spec(spec)
    arch, family = getattr(model, "arch_name", None), getattr(model, "arch_family", None)
    published = fmt == "basecls" and is_basecls_name(path)
    if published:
        check_basecls_name(path)
        if arch is not None and path != arch:
            raise CheckpointError(f"{spec} holds basecls's {path} weights, the model is {arch}: set "
                                  f"model.name={path} (or give {arch}'s weights)")
        path = fetch_basecls_weights(path)
    if not os.path.isfile(path):
        raise CheckpointError(f"{spec}: file {path!r} not found")
    if arch is None or family is None:
        raise CheckpointError(f"{spec}: the target model has no arch_name / arch_family (build it with "
                              f"basebn.models.build_model) so the {fmt} name map cannot be chosen")
    own_shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    head = _linear_keys(model)  # may be resized (allow_new_head)
    eps = sorted({m.eps for m in model.modules() if is_bn(m)} - {FOREIGN_BN_EPS})
    if eps:
        logger.warning(f"{spec}: basecls's models and timm's PyTorch ports use BN eps {FOREIGN_BN_EPS}, this model "
                       f"has {eps}; build it with bn_eps={FOREIGN_BN_EPS} (config: bn.eps={FOREIGN_BN_EPS}) to get "
                       f"their outputs")
    if fmt == "timm":
        return convert_timm(_timm_state(path, ema), arch, family, own_shapes, spec, head), spec
    source = f"{spec} (EMA)" if ema else spec
    state = convert_basecls(_basecls_state(path, ema), arch, family, own_shapes, source, head)
    return bgr_to_rgb_input(state, model), source  # basecls's models take BGR images, basebn's RGB


def _linear_keys(model):
    """The weight and bias keys of `model`'s Linear layers: the classifiers allow_new_head may resize."""
    linears = [name for name, m in model.named_modules() if isinstance(m, M.Linear)]
    return [f"{name}.{leaf}" for name in linears for leaf in ("weight", "bias")]


def zoo_name(spec):
    """NAME for `zoo:NAME`, None for any other spec."""
    return spec[len(ZOO_PREFIX):] if isinstance(spec, str) and spec.startswith(ZOO_PREFIX) else None


def read_weights(spec: str, ema: bool = False, model: Optional[M.Module] = None,
                 allow_new_head: bool = False) -> Tuple[Dict[str, np.ndarray], str]:
    """The model state a weights spec names, as numpy arrays.

    Given `model`, a checkpoint or weights .npz whose arrays cannot fit it (shape, dtype or name; a classifier
    of another size with allow_new_head) is refused from its .npy headers, before any array is read.

    Args:
        spec: `zoo:NAME`, a checkpoint or weights file, a run directory, `basecls:PATH`, `basecls:NAME` or
            `timm:PATH`.
        ema: the EMA weights of a checkpoint instead of the model's.
        model: the target model; needed by `timm:` and `basecls:` specs (to convert the names).
        allow_new_head: with `model`, accept a classifier of another size.

    Returns:
        (model state as a numpy dict, a description of the source for messages).

    Raises:
        CheckpointError: the spec cannot be read, holds no EMA weights with ema=True, or does not fit `model`.
    """
    if foreign_spec(spec) is not None:
        if model is None:
            raise CheckpointError(f"{spec}: reading {foreign_spec(spec)[0]} weights needs the target model")
        return read_foreign_state(spec, model, ema=ema)
    name = zoo_name(spec)
    if name is not None:
        return load_zoo_weights(name, ema=ema), f"{spec} (EMA)" if ema else spec
    path = resolve_weights(spec)
    fits = None if model is None else member_fit(model, resizable=_linear_keys(model) if allow_new_head else ())
    ckpt = load_checkpoint(path, fits)
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


def load_weights(model: M.Module, spec: str, ema: bool = False, allow_new_head: bool = False) -> None:
    """Load weights into `model`; with allow_new_head a classifier of another size is left initialised.

    Args:
        model: the model to load into (built by build_model for `timm:` and `basecls:` specs).
        spec: `zoo:NAME`, a checkpoint or weights file, a run directory, `basecls:PATH`, `basecls:NAME` or
            `timm:PATH`.
        ema: load the EMA weights of a checkpoint that holds them.
        allow_new_head: keep the model's own classifier where the weights' is of another size.

    Raises:
        CheckpointError: the spec cannot be read, or its arrays do not fit `model`.
    """
    state, source = read_weights(spec, ema=ema, model=model, allow_new_head=allow_new_head)
    own = model.state_dict()
    if allow_new_head:
        head = resized_classifier_keys(model, state)
        if head:
            logger.warning(f"{source}: classifier shape differs ({', '.join(head)}); keeping a new, initialised head")
            state = {k: v for k, v in state.items() if k not in head}
            state.update({k: np.asarray(own[k]) for k in head})
    load_model_state(model, state, source=source)
    logger.info(f"loaded weights from {source}")
