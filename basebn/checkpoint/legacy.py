"""Reading pickles (older runs' `latest.pkl`, basecls's `mge.save` checkpoints) without running their code.

The restricted unpickler admits numpy arrays, dtypes and scalars, plain containers/builtins and MegEngine
Tensors/Parameters (``mge.save`` pickles them as the class plus (ndarray, dtype, device) arguments; a
stand-in keeps only the ndarray, no MegEngine class is constructed). Any other global (os.system,
builtins.eval, a class of some library, ...) is refused with a CheckpointError before it is called.

Nothing in such a file may allocate more than the file holds: the opcodes are read first (pickletools, from the
file's bytes in memory) so that a length field larger than the rest of the file is refused before the
unpickler allocates it, and the admitted globals that allocate from a size (``_reconstruct`` and ``ndarray``
with a shape, ``scalar`` with a dtype, ``bytes`` / ``bytearray`` with a count) are wrapped to refuse a size
above the file's own (numpy's pickles reconstruct an empty array and fill it from data in the file).
"""
import builtins
import collections
import io
import math
import os
import pickle
import pickletools

import numpy as np
import numpy.core.multiarray as _multiarray

from .errors import CheckpointError
from .format import memory_budget_bytes

__all__ = ["LEGACY_FORMAT", "ALLOWED_GLOBALS", "guarded_globals", "load_restricted_pickle", "load_legacy_checkpoint"]

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


_SLACK_BYTES = 1 << 16  # what a tiny file may still allocate (a few scalars)


class _OversizedAllocation(Exception):
    """An admitted global asked to allocate more than the pickle file holds."""


def _nbytes(shape, dtype):
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    return math.prod(int(d) for d in dims) * np.dtype(dtype).itemsize


class _NdarrayGuard:
    """Stands for numpy.ndarray: as a class argument of _reconstruct it is ndarray itself; called, it builds an
    ndarray only when the shape fits the bound."""

    def __init__(self, limit):
        self.limit = limit

    def __call__(self, shape, dtype=float, *args):
        _check_size(_nbytes(shape, dtype), self.limit, "numpy.ndarray")
        return np.ndarray(shape, dtype, *args)


def _check_size(nbytes, limit, what):
    if nbytes > limit:
        raise _OversizedAllocation(f"{what} asks for {nbytes} bytes, more than the file holds ({limit})")


def guarded_globals(limit):
    """ALLOWED_GLOBALS with every global that allocates from a size wrapped to refuse more than `limit` bytes."""
    guard = _NdarrayGuard(limit)

    def reconstruct(subtype, shape, dtype):
        subtype = np.ndarray if subtype is guard else subtype
        _check_size(_nbytes(shape, dtype), limit, "numpy _reconstruct")
        return _multiarray._reconstruct(subtype, shape, dtype)

    def scalar(dtype, *args):
        _check_size(np.dtype(dtype).itemsize, limit, "numpy scalar")
        return _multiarray.scalar(dtype, *args)

    def sized(kind):
        def build(*args):
            if args and isinstance(args[0], int) and not isinstance(args[0], bool):
                _check_size(args[0], limit, kind.__name__)
            return kind(*args)
        return build

    return {**ALLOWED_GLOBALS, ("numpy", "ndarray"): guard,
            ("numpy.core.multiarray", "_reconstruct"): reconstruct, ("numpy.core.multiarray", "scalar"): scalar,
            ("builtins", "bytes"): sized(bytes), ("builtins", "bytearray"): sized(bytearray)}


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, f, path, allowed):
        super().__init__(f)
        self.path, self.allowed = path, allowed

    def find_class(self, module, name):
        found = self.allowed.get((module, name))
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


def _check_opcodes(data, path):
    """Read every opcode and its argument (pickletools refuses a length beyond the data without allocating it)."""
    try:
        for _ in pickletools.genops(io.BytesIO(data)):
            pass
    except (ValueError, EOFError) as exc:
        raise CheckpointError(f"checkpoint {path!r} is truncated or corrupt ({exc}); it was not loaded") from exc


def load_restricted_pickle(path):
    """The object pickled in `path`, MegEngine tensors as ndarrays; anything but data raises CheckpointError, and so
    does any allocation larger than the file (see the module docstring)."""
    size, budget = os.path.getsize(path), memory_budget_bytes()
    if size > budget:
        raise CheckpointError(f"{path!r} is {size / 2**30:.3g} GiB, more than this machine's memory "
                              f"({budget / 2**30:.3g} GiB): it cannot be loaded here")
    try:
        with open(path, "rb") as f:
            data = f.read()
        _check_opcodes(data, path)
        allowed = guarded_globals(max(len(data), _SLACK_BYTES))
        return _arrays_for_tensors(_RestrictedUnpickler(io.BytesIO(data), path, allowed).load())
    except CheckpointError:
        raise
    except _OversizedAllocation as exc:
        raise CheckpointError(f"{path!r}: {exc}: refused, the file was not loaded (a damaged or hostile file?)") \
            from None
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, IndexError, ValueError, TypeError,
            KeyError, OverflowError) as exc:
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
