"""Optimizer with weight decay optionally excluded from norm-layer parameters and biases.

SGD is MegEngine's with an in-place update (:class:`InplaceSGD`): three fused multiply-adds per
parameter instead of six allocating ops; same arguments, state dict and arithmetic.
"""
from typing import Any, Dict, List

import megengine.module as M
import megengine.optimizer as optim
from megengine import tensor
from megengine.functional.inplace import _inplace_add_

from ..layers.norm import is_norm

__all__ = ["param_groups", "build_optimizer", "InplaceSGD"]


def param_groups(model: M.Module, weight_decay: float, exclude_norm_bias: bool = True) -> List[Dict[str, Any]]:
    """The optimizer's parameter groups: decayed and not.

    Args:
        model: the model.
        weight_decay: the decayed group's weight decay.
        exclude_norm_bias: norm-layer parameters (:func:`basebn.layers.norm.is_norm`) and biases go to the group
            without decay.

    Returns:
        ``[{'params': decayed, 'weight_decay': wd}, {'params': others, 'weight_decay': 0}]``.
    """
    no_decay_ids = set()
    if exclude_norm_bias:
        for _, module in model.named_modules():
            if is_norm(module):
                no_decay_ids.update(id(p) for p in module.parameters(recursive=False))
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                no_decay_ids.add(id(p))
    params = list(model.parameters())
    decay = [p for p in params if id(p) not in no_decay_ids]
    other = [p for p in params if id(p) in no_decay_ids]
    return [g for g in ({"params": decay, "weight_decay": weight_decay}, {"params": other, "weight_decay": 0.0})
            if g["params"]]


class InplaceSGD(optim.SGD):
    """``megengine.optimizer.SGD`` updating buffers in place: ``v = momentum * v + g + wd * p``,
    ``p -= lr * v`` (Nesterov: ``p -= lr * (g + wd * p + momentum * v)``), MegEngine's formulas and
    ``momentum_buffer`` state, written as MegEngine's fused ``InplaceAdd`` (``x = a * x + b * y``)."""

    def _updates(self, param_group):
        lr, wd, momentum = param_group["lr"], param_group["weight_decay"], param_group["momentum"]
        one, neg_lr = tensor(1.0, dtype="float32"), tensor(-lr, dtype="float32")
        wd_t, momentum_t = tensor(wd, dtype="float32"), tensor(momentum, dtype="float32")
        for param in param_group["params"]:
            grad = param.grad
            if grad is None:
                continue
            if momentum == 0.0 or self.nesterov:
                if wd != 0.0:
                    grad = grad + param * wd_t
                if momentum != 0.0:  # Nesterov
                    v = self._state[param]["momentum_buffer"]
                    _inplace_add_(v, grad, alpha=momentum_t, beta=one)
                    grad = grad + v * momentum_t
                _inplace_add_(param, grad, alpha=one, beta=neg_lr)
                continue
            v = self._state[param]["momentum_buffer"]
            _inplace_add_(v, grad, alpha=momentum_t, beta=one)
            if wd != 0.0:
                _inplace_add_(v, param, alpha=one, beta=wd_t)
            _inplace_add_(param, v, alpha=one, beta=neg_lr)


def build_optimizer(model: M.Module, solver: Any, lr: float) -> optim.Optimizer:
    """SGD (:class:`InplaceSGD`) or AdamW (``solver.optimizer``) over :func:`param_groups` of ``model``.

    Args:
        model: the model.
        solver: the config's solver section.
        lr: the starting learning rate.

    Raises:
        ValueError: an unknown solver.optimizer.
    """
    groups = param_groups(model, solver.weight_decay, solver.weight_decay_exclude_norm_bias)
    if solver.optimizer == "sgd":
        return InplaceSGD(groups, lr=lr, momentum=solver.momentum, nesterov=solver.nesterov)
    if solver.optimizer == "adamw":
        return optim.AdamW(groups, lr=lr, betas=tuple(solver.betas))
    raise ValueError(f"unknown solver.optimizer {solver.optimizer!r}: use sgd or adamw")
