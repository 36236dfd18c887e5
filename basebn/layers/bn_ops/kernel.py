"""Launch the compiled BN ops (see :mod:`.build`), after making their inputs safe to read.

MegEngine 1.13 runs a CPU custom op without waiting for the CPU comp node's queue, so
:func:`ready` either relies on the kernels' own ``sync_all()`` or drains the queue first.
"""
import functools

import megengine as mge
from megengine.core._imperative_rt.core2 import apply
from megengine.core.ops import custom
from megengine.jit import tracing

from .backend import requested_backend
from .build import KernelUnavailableError, load_kernels

__all__ = ["ready", "stats", "normalize", "backward_reduce", "backward_elemt"]

# True: the CPU kernels gather every input as if it were non-contiguous (tests of that path)
_force_strided = False


def _symbolic_tracing():
    """Inside ``jit.trace(symbolic=True)`` (values do not exist yet; _dev_tensor() would crash)."""
    if not tracing.is_tracing():
        return False
    tr = getattr(tracing.active_trace, "_trace", None)
    return bool(getattr(tr, "symbolic", True))  # unknown: assume symbolic (the safe side)


def ready(x, *others):
    """Can the kernels take ``x`` (and the per-channel ``others``) now? Waits for their producers if needed.

    False for empty tensors and for GPU tensors when the library has no CUDA part (raises
    :class:`KernelUnavailableError` then if the kernel backend is forced).
    Two races are avoided on CPU (both seen as wrong results): inputs still being written by queued
    ops, and the asynchronous to-contiguous copy of non-contiguous inputs. When the library's
    kernels call ``mgb::CompNode::sync_all()`` themselves (MegEngine 1.13 exports it; this also
    covers compiled ``jit.trace`` graphs) nothing is done here; otherwise ``_dev_tensor()`` runs the
    conversion now and ``_full_sync()`` drains the queue.
    """
    if x.size == 0:
        return False
    lib = load_kernels()
    if str(x.device.physical_name).startswith("gpu"):
        if not lib["cuda"]:
            if requested_backend() == "kernel":
                raise KernelUnavailableError("basebn BN kernels were built without CUDA")
            return False
        return True
    if lib["self_sync"] or _symbolic_tracing():
        return True
    for t in (x,) + others:
        if t is not None:
            t._dev_tensor()
    mge._full_sync()
    return True


@functools.lru_cache(maxsize=512)
def _op(name, **params):
    return getattr(custom, name)(**params)


def _apply(name, *inputs, **params):
    return apply(_op(name, force_strided=_force_strided, **params), *inputs)


def stats(x):
    """Per-channel ``(mean, m2)`` (Welford/Chan-merged blocks)."""
    mean, m2 = _apply("BasebnBnStats", x)
    return mean, m2


def normalize(x, mean, invstd, weight, bias):
    """``(x - mean) * invstd * weight + bias``; a missing weight/bias slot holds a placeholder."""
    (y,) = _apply("BasebnBnNormalize", x, mean, invstd, mean if weight is None else weight,
                  mean if bias is None else bias, has_weight=weight is not None, has_bias=bias is not None)
    return y


def backward_reduce(dy, x, mean, invstd):
    """Per-channel ``(sum(dy), sum(dy * xhat))``; dy and x have one dtype."""
    s1, s2 = _apply("BasebnBnBackwardReduce", dy, x, mean, invstd)
    return s1, s2


def backward_elemt(dy, x, mean, invstd, weight, sum_dy, sum_dy_xhat, count):
    """``dx`` in the (common) dtype of dy and x."""
    (dx,) = _apply("BasebnBnBackwardElemt", dy, x, mean, invstd, mean if weight is None else weight,
                   sum_dy, sum_dy_xhat, has_weight=weight is not None, count=float(count))
    return dx
