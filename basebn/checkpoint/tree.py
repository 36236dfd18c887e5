"""Nested Python values <-> (a JSON-able tree, named numpy arrays): how checkpoint metadata holds nested state.

Arrays become {"__array__": NAME}; numpy scalars {"__scalar__": NAME} (a 0-d array, so the dtype survives);
tuples {"__tuple__": [...]}; dicts with a non-str key (optimizer state is keyed by int) {"__items__": [[k, v]]}.
"""
import numpy as np

from .errors import CheckpointError

__all__ = ["pack", "unpack"]

_MARKERS = ("__array__", "__scalar__", "__tuple__", "__items__")


def pack(obj, prefix):
    """-> (tree, {name: array}); array names are `prefix` + a running number."""
    arrays = {}

    def enc(o, where):
        if isinstance(o, np.ndarray):
            if o.dtype == object:
                raise CheckpointError(f"cannot store an object array at {where or '/'} in a checkpoint")
            name = f"{prefix}{len(arrays)}"
            arrays[name] = o
            return {"__array__": name}
        if isinstance(o, np.generic):
            name = f"{prefix}{len(arrays)}"
            arrays[name] = np.asarray(o)
            return {"__scalar__": name}
        if o is None or isinstance(o, (bool, int, float, str)):
            return o
        if isinstance(o, tuple):
            return {"__tuple__": [enc(v, f"{where}/{i}") for i, v in enumerate(o)]}
        if isinstance(o, list):
            return [enc(v, f"{where}/{i}") for i, v in enumerate(o)]
        if isinstance(o, dict):
            if all(isinstance(k, str) for k in o) and not set(o) & set(_MARKERS):
                return {k: enc(o[k], f"{where}/{k}") for k in sorted(o)}  # names independent of key order
            return {"__items__": [[enc(k, f"{where}/<key>"), enc(v, f"{where}/{k}")] for k, v in o.items()]}
        raise CheckpointError(f"cannot store a {type(o).__name__} at {where or '/'} in a checkpoint")

    return enc(obj, ""), arrays


def unpack(tree, arrays, source="checkpoint"):
    """Inverse of pack: `tree` with its references replaced by the arrays they name."""

    def dec(t):
        if isinstance(t, list):
            return [dec(v) for v in t]
        if not isinstance(t, dict):
            return t
        if len(t) == 1:
            (key, value), = t.items()
            if key in ("__array__", "__scalar__"):
                if value not in arrays:
                    raise CheckpointError(f"{source}: metadata refers to array {value!r}, which the file lacks")
                return arrays[value] if key == "__array__" else arrays[value][()]
            if key == "__tuple__":
                return tuple(dec(v) for v in value)
            if key == "__items__":
                return {_hashable(dec(k)): dec(v) for k, v in value}
        return {k: dec(v) for k, v in t.items()}

    return dec(tree)


def _hashable(key):
    return tuple(key) if isinstance(key, list) else key
