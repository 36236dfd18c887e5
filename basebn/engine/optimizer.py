"""Optimizer with weight decay optionally excluded from norm-layer parameters and biases."""
import megengine.optimizer as optim

from ..layers.norm import is_norm

__all__ = ["param_groups", "build_optimizer"]


def param_groups(model, weight_decay, exclude_norm_bias=True):
    """[{'params': decayed, 'weight_decay': wd}, {'params': others, 'weight_decay': 0}]; with
    ``exclude_norm_bias``, norm-layer parameters (:func:`basebn.layers.norm.is_norm`) and biases are the others."""
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


def build_optimizer(model, solver, lr):
    """SGD or AdamW (``solver.optimizer``) over :func:`param_groups` of ``model``."""
    groups = param_groups(model, solver.weight_decay, solver.weight_decay_exclude_norm_bias)
    if solver.optimizer == "sgd":
        return optim.SGD(groups, lr=lr, momentum=solver.momentum, nesterov=solver.nesterov)
    if solver.optimizer == "adamw":
        return optim.AdamW(groups, lr=lr, betas=tuple(solver.betas))
    raise ValueError(f"unknown solver.optimizer {solver.optimizer!r}: use sgd or adamw")
