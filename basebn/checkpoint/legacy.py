"""Reading pickles (older runs' `latest.pkl`, basecls's `mge.save` checkpoints) without running their code.

The restricted unpickler admits numpy arrays, dtypes and scalars, plain containers/builtins and MegEngine
Tensors/Parameters (``mge.save`` pickles them as the class plus (ndarray, dtype, device) arguments; a
stand-in keeps only the ndarray, no MegEngine class is constructed). Any other global (os.system,
builtins.eval, a class of some library, ...) is refused with a CheckpointError before it is called.
"""
import builtins
import collections
import pickle

import numpy as np
import numpy.core.multiarray as _multiarray

from .errors import CheckpointError

__all__ = ["LEGACY_FORMAT", "ALLOWED_GLOBALS", "load_restricted_pickle", "load_legacy_checkpoint"]

LEGACY_FORMAT = "basebn-checkpoint-v1"

_BUILTINS = ("dict", "list", "tuple", "set", "frozenset", "int", "float", "bool", "str", "bytes", "bytearray",
             "complex")


class _TensorStandIn:
    """What a pickled MegEngine Tensor/Parameter becomes: its ndarray, nothing else (state is ignored)."""

    def __new__(cls, data=None, *unused):
        inst = object.__new__(cls)
        inst.array = np.asarray(data)
        return inst

    def __setstate__(self, state):
        pass


ALLOWED_GLOBALS = {
    ("megengine.tensor", "Tensor"): _TensorStandIn,
    ("megengine.tensor", "Parameter"): _TensorStandIn,
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
                f"{self.path!r}: refused to load global {module}.{name}: a .pkl checkpoint may hold only numpy "
                f"arrays, MegEngine tensors and plain containers (anything else could run code); the file was "
                f"not loaded")
        return found


def _arrays_for_tensors(obj):
    """`obj` with every MegEngine tensor stand-in replaced by its ndarray (dicts, lists, tuples walked)."""
    if isinstance(obj, _TensorStandIn):
        return obj.array
    if isinstance(obj, dict):
        return type(obj)((k, _arrays_for_tensors(v)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(_arrays_for_tensors(v) for v in obj)
    return obj


def load_restricted_pickle(path):
    """The object pickled in `path`, MegEngine tensors as ndarrays; anything but data raises CheckpointError."""
    try:
        with open(path, "rb") as f:
            return _arrays_for_tensors(_RestrictedUnpickler(f, path).load())
    except CheckpointError:
        raise
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, IndexError, ValueError, TypeError,
            KeyError) as exc:
        raise CheckpointError(
            f"checkpoint {path!r} is truncated or corrupt ({type(exc).__name__}: {exc}); use another file"
        ) from exc


def load_legacy_checkpoint(path):
    """The dict a pre-npz basebn run pickled (or a bare {name: array} state dict, as {'model': ...})."""
    data = load_restricted_pickle(path)
    if isinstance(data, dict) and data.get("format") == LEGACY_FORMAT and isinstance(data.get("model"), dict):
        return data
    if isinstance(data, dict) and data and all(isinstance(v, np.ndarray) for v in data.values()):
        return {"format": LEGACY_FORMAT, "model": data}  # a bare state dict (e.g. megengine.save(model.state_dict()))
    raise CheckpointError(f"{path!r} is not a basebn checkpoint (no model state found)")
