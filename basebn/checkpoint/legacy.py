"""Reading the pickled training checkpoints of older runs (`latest.pkl`, ...) without running their code.

The restricted unpickler admits numpy arrays, dtypes and scalars and plain containers/builtins; any other
global (os.system, builtins.eval, a class of some library, ...) is refused with a CheckpointError before it
is called.
"""
import builtins
import collections
import pickle

import numpy as np
import numpy.core.multiarray as _multiarray

from .errors import CheckpointError

__all__ = ["LEGACY_FORMAT", "ALLOWED_GLOBALS", "load_legacy_checkpoint"]

LEGACY_FORMAT = "basebn-checkpoint-v1"

_BUILTINS = ("dict", "list", "tuple", "set", "frozenset", "int", "float", "bool", "str", "bytes", "bytearray",
             "complex")
ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"): _multiarray._reconstruct,
    ("numpy.core.multiarray", "scalar"): _multiarray.scalar,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("collections", "OrderedDict"): collections.OrderedDict,
    **{("builtins", name): getattr(builtins, name) for name in _BUILTINS},
}


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, f, path):
        super().__init__(f)
        self.path = path

    def find_class(self, module, name):
        found = ALLOWED_GLOBALS.get((module, name))
        if found is None:
            raise CheckpointError(
                f"{self.path!r}: refused to load global {module}.{name}: a legacy .pkl checkpoint may hold only "
                f"numpy arrays and plain containers (anything else could run code); the file was not loaded")
        return found


def load_legacy_checkpoint(path):
    """The dict a pre-npz basebn run pickled (or a bare {name: array} state dict, as {'model': ...})."""
    try:
        with open(path, "rb") as f:
            data = _RestrictedUnpickler(f, path).load()
    except CheckpointError:
        raise
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, IndexError, ValueError, TypeError,
            KeyError) as exc:
        raise CheckpointError(
            f"checkpoint {path!r} is truncated or corrupt ({type(exc).__name__}: {exc}); use another file"
        ) from exc
    if isinstance(data, dict) and data.get("format") == LEGACY_FORMAT and isinstance(data.get("model"), dict):
        return data
    if isinstance(data, dict) and data and all(isinstance(v, np.ndarray) for v in data.values()):
        return {"format": LEGACY_FORMAT, "model": data}  # a bare state dict (e.g. megengine.save(model.state_dict()))
    raise CheckpointError(f"{path!r} is not a basebn checkpoint (no model state found)")
