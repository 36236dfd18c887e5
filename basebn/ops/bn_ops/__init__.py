"""Raw BatchNorm ops (no autograd): statistics, normalisation and the two backward passes.

Two interchangeable paths with the same numerics: C++/CUDA custom ops (:mod:`.kernel`, launching
the ops of :mod:`basebn.ops.kernel_library`, compiled on first use) and pure MegEngine
(:mod:`.fallback`); :mod:`.backend` picks one (``$BASEBN_BN_BACKEND``), :mod:`.ops` dispatches.
``x``/``dy`` are (N, C, *) with 2 to 5 dims, float32 or float16; per-channel tensors are float32
(C,). Whether the kernels loaded, and why not: ``kernel_library.kernel_available()`` /
``kernel_error()`` (its environment variables are listed there).
"""
from .backend import backend, use_backend
from .ops import bn_backward_elemt, bn_backward_reduce, bn_normalize, bn_stats, channel_count
from .ops import ACTIVATIONS, OUTPUT_GRAD_ACTIVATIONS, PRE_GRAD_ACTIVATIONS
from .ops import bn_act_backward_elemt, bn_act_backward_reduce, bn_act_normalize
from .ops import bn_act_train_backward, bn_act_train_forward, bn_act_train_forward_update, bn_running_update

__all__ = [
    "bn_stats",
    "bn_normalize",
    "bn_backward_reduce",
    "bn_backward_elemt",
    "channel_count",
    "ACTIVATIONS",
    "OUTPUT_GRAD_ACTIVATIONS",
    "PRE_GRAD_ACTIVATIONS",
    "bn_act_normalize",
    "bn_act_backward_reduce",
    "bn_act_backward_elemt",
    "bn_act_train_forward",
    "bn_act_train_forward_update",
    "bn_act_train_backward",
    "bn_running_update",
    "backend",
    "use_backend",
]
