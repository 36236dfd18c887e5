"""Optimizer with weight decay optionally excluded from norm-layer parameters and biases."""
import megengine.module as M
import megengine.optimizer as optim

__all__ = ["param_groups", "build_optimizer", "NORM_TYPES"]


def _norm_types():
    types = [M.BatchNorm1d, M.BatchNorm2d, M.GroupNorm, M.InstanceNorm, M.LayerNorm]
    try:
        from ..layers.sync_bn import SyncBatchNorm

        types.append(SyncBatchNorm)
    except ImportError:
        pass
    return tuple(types)


NORM_TYPES = _norm_types()


def param_groups(model, weight_decay, exclude_norm_bias=True):
    """[{'params': decayed, 'weight_decay': wd}, {'params': others, 'weight_decay': 0}]"""
    no_decay_ids = set()
    if exclude_norm_bias:
        for _, module in model.named_modules():
            if isinstance(module, NORM_TYPES):
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
    groups = param_groups(model, solver.weight_decay, solver.weight_decay_exclude_norm_bias)
    if solver.optimizer == "sgd":
        return optim.SGD(groups, lr=lr, momentum=solver.momentum, nesterov=solver.nesterov)
    if solver.optimizer == "adamw":
        return optim.AdamW(groups, lr=lr, betas=tuple(solver.betas))
    raise ValueError(f"unknown solver.optimizer {solver.optimizer!r}: use sgd or adamw")
