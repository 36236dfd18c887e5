"""Helpers shared by the collective backends: Tensor <-> numpy round trips that keep dtype/device."""
import megengine as mge
import numpy as np


def is_tensor(x):
    """True for a megengine Tensor."""
    return isinstance(x, mge.Tensor)


def to_numpy(x):
    """Return ``(array, like)``: a C-contiguous numpy copy/view of ``x`` and what to convert back to.

    ``like`` is the megengine Tensor when ``x`` is one (the result goes back to a Tensor on the same
    device with the same dtype), else ``None`` (the result stays numpy).
    """
    if is_tensor(x):
        return np.require(x.numpy(), requirements="C"), x
    return np.require(np.asarray(x), requirements="C"), None


def from_numpy(arr, like):
    """Inverse of :func:`to_numpy`: numpy stays numpy, a Tensor ``like`` gives a Tensor like it."""
    if like is None:
        return arr
    return mge.tensor(arr, dtype=like.dtype, device=like.device)
