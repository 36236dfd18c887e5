"""Launch the compiled BN ops (in :mod:`basebn.ops.kernel_library`), after making their inputs safe to read.

:func:`ready` says whether the kernels can take a tensor and, on CPU, waits for its producers
(:func:`basebn.ops.kernel_library.wait_for_inputs`).
"""
import functools

import numpy as np

import megengine as mge
from megengine.core._imperative_rt.core2 import apply
from megengine.core.ops import custom

from ..kernel_library import KernelUnavailableError, has_values, load_kernels, wait_for_inputs
from .backend import requested_backend

__all__ = ["ready", "ready_on_cpu", "stats", "normalize", "backward_reduce", "backward_elemt", "ACT_CODES",
           "act_normalize", "act_backward_reduce", "act_backward_elemt", "act_train_forward",
           "act_train_forward_update", "act_train_backward", "running_update"]

# True: the CPU kernels gather every input as if it were non-contiguous (tests of that path)
_force_strided = False


def _on_gpu(x):
    return str(x.device.physical_name).startswith("gpu")


def _launchable(x, on_gpu, others):
    """:func:`ready` with the device of ``x`` already known (one device query per launch)."""
    if not has_values(x):
        return False
    lib = load_kernels()
    if on_gpu:
        if not lib["cuda"]:
            if requested_backend() == "kernel":
                raise KernelUnavailableError("basebn BN kernels were built without CUDA")
            return False
        return True
    wait_for_inputs(x, *others)
    return True


def ready(x, *others):
    """Can the kernels take ``x`` (and the per-channel ``others``) now? Waits for their producers if needed.

    False for empty tensors and for GPU tensors when the library has no CUDA part (raises
    :class:`KernelUnavailableError` then if the kernel backend is forced). On CPU the inputs are
    made safe to read first (:func:`basebn.ops.kernel_library.wait_for_inputs`).
    """
    return _launchable(x, _on_gpu(x), others)


def ready_on_cpu(x, *others):
    """:func:`ready` for the CPU-only ops (the one-call training passes): False for GPU tensors."""
    return not _on_gpu(x) and _launchable(x, False, others)


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


# ---- fused BN -> activation ops (basebn/ops/csrc/bn_act_cpu.cpp); codes as BnAct in bn_math.h
ACT_CODES = {"identity": 0, "relu": 1, "relu6": 2, "silu": 3, "hswish": 4}


def _affine(mean, weight, bias, act):
    """The (weight, bias) input slots (``mean`` as the placeholder of a missing one) and their flags with ``act``."""
    slots = (mean if weight is None else weight, mean if bias is None else bias)
    return slots, dict(has_weight=weight is not None, has_bias=bias is not None, act=ACT_CODES[act])


def act_normalize(x, shortcut, mean, invstd, weight, bias, act):
    """``act((x - mean) * invstd * weight + bias [+ shortcut])``; shortcut (or None) has x's dtype."""
    affine, flags = _affine(mean, weight, bias, act)
    if shortcut is None:
        (y,) = _apply("BasebnBnActNormalize", x, mean, invstd, *affine, **flags)
    else:
        (y,) = _apply("BasebnBnAddActNormalize", x, shortcut, mean, invstd, *affine, **flags)
    return y


def act_backward_reduce(dy, y, x, mean, invstd, weight, bias, act):
    """Per-channel ``(sum(dz), sum(dz * xhat))`` with ``dz = act'(pre) * dy``; dy, y, x have one dtype. The kernel
    reads ``y`` (ReLU, ReLU6) or recomputes ``pre`` from x and the affine (SiLU, HSwish); None: x stands in."""
    affine, flags = _affine(mean, weight, bias, act)
    s1, s2 = _apply("BasebnBnActBackwardReduce", dy, x if y is None else y, x, mean, invstd, *affine, **flags)
    return s1, s2


def act_backward_elemt(dy, y, x, mean, invstd, weight, bias, sum_dz, sum_dz_xhat, count, act, shortcut_grad):
    """``(dx,)``, or ``(dx, dshortcut)`` when ``shortcut_grad``: ``dshortcut = dz = act'(pre) * dy`` (``y`` as
    in :func:`act_backward_reduce`)."""
    name = "BasebnBnAddActBackwardElemt" if shortcut_grad else "BasebnBnActBackwardElemt"
    affine, flags = _affine(mean, weight, bias, act)
    return tuple(_apply(name, dy, x if y is None else y, x, mean, invstd, *affine, sum_dz, sum_dz_xhat,
                        count=float(count), **flags))


# ---- one-call local training passes (basebn/ops/csrc/bn_train_cpu.cpp), CPU only
def act_train_forward(x, shortcut, weight, bias, eps, act):
    """``(y, mean, m2, invstd)``: local batch statistics and ``act(bn(x) [+ shortcut])`` in one op."""
    holder = weight if weight is not None else bias
    if holder is None:  # the weight / bias slots need a float32 (C,) placeholder
        holder = mge.tensor(np.zeros((x.shape[1],), np.float32), device=x.device)
    affine, flags = _affine(holder, weight, bias, act)
    name = "BasebnBnActTrainForward" if shortcut is None else "BasebnBnAddActTrainForward"
    inputs = (x,) if shortcut is None else (x, shortcut)
    y, mean, m2, invstd = _apply(name, *inputs, *affine, eps=float(eps), **flags)
    return y, mean, m2, invstd


def act_train_forward_update(x, shortcut, weight, bias, eps, act, running_mean, running_var, bad, keep):
    """:func:`act_train_forward`'s four outputs, then ``running_mean', running_var', bad'`` (:func:`running_update`
    with the batch mean and unbiased variance) from the same op."""
    holder = weight if weight is not None else bias
    if holder is None:
        holder = mge.tensor(np.zeros((x.shape[1],), np.float32), device=x.device)
    affine, flags = _affine(holder, weight, bias, act)
    name = "BasebnBnActTrainForwardUpdate" if shortcut is None else "BasebnBnAddActTrainForwardUpdate"
    inputs = (x,) if shortcut is None else (x, shortcut)
    return tuple(_apply(name, *inputs, *affine, running_mean, running_var, bad, eps=float(eps), keep=float(keep),
                        **flags))


def act_train_backward(dy, y, x, mean, invstd, weight, bias, act, shortcut_grad):
    """``(dx, dshortcut or None, sum_dz, sum_dz_xhat)`` of the local BN -> act in one op (count = N * S)."""
    affine, flags = _affine(mean, weight, bias, act)
    name = "BasebnBnAddActTrainBackward" if shortcut_grad else "BasebnBnActTrainBackward"
    outs = _apply(name, dy, x if y is None else y, x, mean, invstd, *affine, **flags)
    if shortcut_grad:
        return tuple(outs)
    dx, s1, s2 = outs
    return dx, None, s1, s2


# ---- the guarded running-statistics update (basebn/ops/csrc/bn_running_cpu.cpp), CPU only
def running_update(running_mean, running_var, mean, var, keep, bad):
    """``(running_mean', running_var', bad')``: moved by a finite batch, else kept bit for bit and ``bad + 1``."""
    outs = apply(_op("BasebnBnRunningUpdate", keep=float(keep)), running_mean, running_var, mean, var, bad)
    return tuple(outs)
