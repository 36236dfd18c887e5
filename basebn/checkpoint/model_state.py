"""Model state <-> numpy dicts: model_state (portable, device-free) and load_model_state (says what does not fit);
member_fit checks a file's declared shapes and dtypes against a model before any array is read.

Not to be confused with basebn.engine.training_state (what a training checkpoint holds: model, optimizer,
EMA, progress, ...): this module is the model-weights part only, shared by checkpoints, weights and the zoo.
"""
import numpy as np

from .errors import CheckpointError
from .format import declared_nbytes

__all__ = ["model_state", "load_model_state", "member_fit"]

_ARRAY_PREFIXES = ("model/", "ema/")  # a file's model and EMA arrays (payload.py's layout)
_MIN_OTHER_BYTES = 1 << 20  # what any other member (optimizer state, metadata) may declare, at least


def model_state(module):
    """state_dict as numpy arrays."""
    return {k: np.asarray(v) for k, v in module.state_dict().items()}


def member_fit(module, resizable=()):
    """A `fits` check for read_container / load_checkpoint: the misfit (in words) of a file entry against
    `module`, or None. `model/NAME` and `ema/NAME` must be a NAME of module's state dict with its shape and
    dtype (for a key in `resizable`, a classifier another class count may replace, only the dimensions after
    the first); any other entry (optimizer state, metadata) may declare at most the model's whole size (1 MiB
    at least), as much as a checkpoint of this model holds per entry."""
    own = {k: (tuple(v.shape), np.dtype(v.dtype)) for k, v in module.state_dict().items()}
    limit = max(_MIN_OTHER_BYTES, sum(declared_nbytes(shape, dtype) for shape, dtype in own.values()))
    resizable = set(resizable)

    def fits(entry, shape, dtype):
        prefix = next((p for p in _ARRAY_PREFIXES if entry.startswith(p)), None)
        if prefix is None:
            size = declared_nbytes(shape, dtype)
            return f"{entry} declares {size} bytes, more than this model's {limit}" if size > limit else None
        key = entry[len(prefix):]
        if key not in own:
            return f"{entry} is not in the model"
        own_shape, own_dtype = own[key]
        if key in resizable:  # another class count: the first dimension may differ
            same = len(shape) == len(own_shape) and shape[1:] == own_shape[1:]
        else:
            same = shape == own_shape
        if same and dtype == own_dtype:
            return None
        return f"{entry} is {shape} {dtype} in the file, {own_shape} {own_dtype} in the model"

    return fits


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
