"""Checkpoint payloads (nested dicts) <-> files; weights files (zoo exports) in the same container.

A payload is {"model": {name: array}, "ema": {"module": {name: array}, ...} or None, ...}; model and EMA
arrays are stored as `model/NAME` and `ema/NAME` (the zoo's layout), every other value in the JSON metadata
(arrays inside it by reference, see tree.py). load_checkpoint reads both formats by their first bytes: the
.npz container (checksum verified) and legacy pickles (restricted unpickler).
"""
import numpy as np

from .errors import CheckpointError
from .format import read_container, read_meta, sniff, write_container
from .legacy import load_legacy_checkpoint
from .tree import pack, unpack

__all__ = ["FORMAT", "WEIGHTS_FORMAT", "save_checkpoint", "load_checkpoint", "read_recorded_config", "save_npz_weights",
           "read_npz_weights"]

FORMAT = "basebn-checkpoint-v2"
WEIGHTS_FORMAT = "weights"  # load_checkpoint's "format" for a weights-only file (zoo export)
_MODEL, _EMA, _STATE = "model/", "ema/", "state/"


def save_checkpoint(path, payload):
    """Atomically write `payload` as an .npz checkpoint with its checksum."""
    arrays = {_MODEL + k: np.asarray(v) for k, v in payload["model"].items()}
    rest = {k: v for k, v in payload.items() if k not in ("model", "format")}
    ema = payload.get("ema")
    if ema is not None:
        arrays.update({_EMA + k: np.asarray(v) for k, v in ema["module"].items()})
        rest["ema"] = {k: v for k, v in ema.items() if k != "module"}
    tree, state_arrays = pack(rest, _STATE)
    arrays.update(state_arrays)
    write_container(path, arrays, {"format": FORMAT, **tree})


def load_checkpoint(path, fits=None):
    """The payload of a checkpoint (.npz or legacy .pkl); a weights-only file gives {"model", "ema", "meta"}.
    `fits` (model_state.member_fit of the target model): an .npz that cannot fit it is refused unread."""
    try:
        kind = sniff(path)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path!r} does not exist") from None
    except IsADirectoryError:
        raise CheckpointError(f"checkpoint {path!r} is a directory, not a file") from None
    if kind == "pickle":
        return load_legacy_checkpoint(path)
    arrays, meta, checked = read_container(path, fits)
    model, ema, state = _split(arrays)
    fmt = meta.get("format")
    if fmt == FORMAT:
        if not checked:
            raise CheckpointError(f"{path!r} is a basebn checkpoint without its checksum entry: it was altered; "
                                  f"use another checkpoint")
        payload = unpack({k: v for k, v in meta.items() if k != "format"}, state, source=repr(path))
        extra = payload.get("ema")
        payload.update(format=FORMAT, model=model, ema=None if extra is None else {"module": ema, **extra})
        return payload
    if fmt is not None:
        raise CheckpointError(f"{path!r} has format {fmt!r}, which this basebn cannot read (newer version?)")
    if not model:
        raise CheckpointError(f"{path!r} is not a basebn checkpoint or weights file (no model/ arrays)")
    return {"format": WEIGHTS_FORMAT, "model": model, "ema": {"module": ema} if ema else None, "meta": meta}


def read_recorded_config(path):
    """The config a checkpoint records (its run's resolved config), or None: from the metadata alone for an .npz
    (no array is read; its checksum is verified when the file is loaded), from the whole file for a legacy .pkl."""
    try:
        kind = sniff(path)
    except OSError:
        raise CheckpointError(f"checkpoint {path!r} cannot be read") from None
    if kind == "pickle":
        config = load_legacy_checkpoint(path).get("config")
    else:
        meta = read_meta(path)
        config = unpack(meta.get("config"), {}, source=repr(path)) if meta.get("format") == FORMAT else None
    return config if isinstance(config, dict) else None


def save_npz_weights(path, model_state, ema_state=None, meta=None):
    """A weights-only file (zoo export): model/ and ema/ arrays + descriptive `meta`, with the checksum."""
    arrays = {_MODEL + k: np.asarray(v) for k, v in model_state.items()}
    if ema_state:
        arrays.update({_EMA + k: np.asarray(v) for k, v in ema_state.items()})
    write_container(path, arrays, meta or {})


def read_npz_weights(path):
    """-> (model_state, ema_state or None, meta) of a weights file or .npz checkpoint. Never unpickles."""
    arrays, meta, _ = read_container(path)
    model, ema, _ = _split(arrays)
    return model, ema or None, meta


def _split(arrays):
    model = {k[len(_MODEL):]: v for k, v in arrays.items() if k.startswith(_MODEL)}
    ema = {k[len(_EMA):]: v for k, v in arrays.items() if k.startswith(_EMA)}
    state = {k: v for k, v in arrays.items() if k.startswith(_STATE)}
    return model, ema, state
