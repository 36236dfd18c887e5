"""Checkpoint files: atomic writes, clear errors on corrupt files or mismatched architectures.

A training checkpoint is a pickled dict of numpy arrays and plain Python values (it is the user's own
file; zoo weights use the pickle-free format in basebn.zoo).
"""
import os
import pickle
import tempfile

import numpy as np

__all__ = ["CheckpointError", "atomic_write_bytes", "save_checkpoint", "load_checkpoint", "resolve_weights",
           "model_state", "load_model_state", "FINAL", "LATEST", "BEST"]

LATEST, BEST, FINAL = "latest.pkl", "best.pkl", "final.pkl"
_MAGIC = "basebn-checkpoint-v1"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used as asked; the message names the file and the problem."""


def atomic_write_bytes(path, data):
    """Write `data` to a temp file beside `path`, fsync, then rename: `path` is never half-written."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)


def model_state(module):
    """state_dict as numpy arrays (portable, device-free)."""
    return {k: np.asarray(v) for k, v in module.state_dict().items()}


def save_checkpoint(path, payload):
    atomic_write_bytes(path, pickle.dumps({"format": _MAGIC, **payload}, protocol=4))


def load_checkpoint(path):
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint {path!r} does not exist")
    try:
        with open(path, "rb") as f:
            data = pickle.load(f)
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, IndexError, ValueError, TypeError) as exc:
        raise CheckpointError(
            f"checkpoint {path!r} is truncated or corrupt ({type(exc).__name__}: {exc}); "
            f"use another file (the run directory keeps {LATEST}, {BEST} and epoch_N.pkl)"
        ) from exc
    if not isinstance(data, dict) or data.get("format") != _MAGIC:
        if isinstance(data, dict) and all(isinstance(v, np.ndarray) for v in data.values()):
            return {"format": _MAGIC, "model": data}  # a bare state dict (e.g. megengine.save(model.state_dict()))
        raise CheckpointError(f"{path!r} is not a basebn checkpoint (no model state found)")
    return data


def resolve_weights(spec):
    """A checkpoint file, or a run directory (its final weights, else its latest checkpoint)."""
    if os.path.isdir(spec):
        for name in (FINAL, LATEST):
            if os.path.isfile(os.path.join(spec, name)):
                return os.path.join(spec, name)
        raise CheckpointError(f"run directory {spec!r} holds neither {FINAL} nor {LATEST}: has the run saved yet?")
    if not os.path.exists(spec):
        raise CheckpointError(f"weights {spec!r} not found: give a checkpoint file, a run directory or zoo:NAME")
    return spec


def load_model_state(module, state, source="checkpoint", strict=True):
    """Load numpy `state` into `module`, failing with the list of mismatched keys and shapes."""
    own = module.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    shapes = [f"{k}: checkpoint {tuple(np.shape(state[k]))} vs model {tuple(own[k].shape)}"
              for k in sorted(set(own) & set(state)) if tuple(np.shape(state[k])) != tuple(own[k].shape)]
    if shapes or (strict and (missing or unexpected)):
        lines = []
        if missing:
            lines.append(f"missing in checkpoint ({len(missing)}): {', '.join(missing[:20])}")
        if unexpected:
            lines.append(f"not in model ({len(unexpected)}): {', '.join(unexpected[:20])}")
        if shapes:
            lines.append(f"shape mismatch ({len(shapes)}): " + "; ".join(shapes[:20]))
        raise CheckpointError(
            f"{source} does not fit this model (different architecture, num_classes or norm?):\n  "
            + "\n  ".join(lines)
        )
    module.load_state_dict({k: v for k, v in state.items() if k in own}, strict=False)
