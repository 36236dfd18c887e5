"""Model EMA (timm's ModelEma, pycls/basecls schedule), vectorised: one fused update for all tensors.

The averaged values live in one flat float32 buffer; each update is a single concat of the model's
tensors plus one multiply-add, instead of one small op per tensor. The EMA module's tensors are
refreshed from the buffer only when `.module` is read (evaluation, checkpoints).
"""
import copy

import numpy as np

import megengine as mge
import megengine.functional as F

__all__ = ["ModelEMA", "pycls_momentum", "ema_should_update"]


def pycls_momentum(alpha, total_batch_size, max_epoch, update_period):
    """max(0, 1 - alpha * total_batch_size / max_epoch * update_period) (pycls PR #138, basecls)."""
    return max(0.0, 1.0 - alpha * total_batch_size / max_epoch * update_period)


def ema_should_update(iter_global, epoch, start_epoch, update_period):
    """'copy' before `start_epoch` (0-based; 0 = from the first epoch), then 'update' every
    `update_period` iterations, else 'skip'."""
    if epoch < (start_epoch or 0):
        return "copy"
    return "update" if (iter_global + 1) % update_period == 0 else "skip"


def _named_tensors(module):
    return list(module.named_parameters()) + list(module.named_buffers())


def _is_float(t):
    return np.issubdtype(np.dtype(t.dtype), np.floating)


class ModelEMA:
    """e = m * e + (1 - m) * p for every parameter and float buffer (buffers copied with copy_buffers)."""

    def __init__(self, model, momentum=0.9999, copy_buffers=False):
        self.momentum = momentum
        self.copy_buffers = copy_buffers
        self.updates = 0
        self._module = copy.deepcopy(model)
        self._module.eval()
        params = {n for n, _ in self._module.named_parameters()}
        named = _named_tensors(self._module)
        self._avg = [n for n, t in named if _is_float(t) and (n in params or not copy_buffers)]
        self._copy = [n for n, _ in named if n not in set(self._avg)]
        self._shapes = dict((n, tuple(t.shape)) for n, t in named)
        self._flat = self._gather(self._module)
        self._stale = False

    def _gather(self, model):
        tensors = dict(_named_tensors(model))
        return F.concat([tensors[n].astype("float32").reshape(-1) for n in self._avg]).detach()

    def _copy_others(self, model):
        own, src = dict(_named_tensors(self._module)), dict(_named_tensors(model))
        for n in self._copy:
            own[n]._reset(mge.tensor(src[n].numpy()))

    def update(self, model, momentum=None):
        m = self.momentum if momentum is None else momentum
        self._flat = (self._flat * m + self._gather(model) * (1.0 - m)).detach()
        self._copy_others(model)
        self.updates += 1
        self._stale = True

    def copy_from(self, model):
        self._flat = self._gather(model)
        self._copy_others(model)
        self._stale = True

    @property
    def module(self):
        """The averaged model (eval mode), refreshed from the flat buffer when needed."""
        if self._stale:
            own, offset = dict(_named_tensors(self._module)), 0
            for n in self._avg:
                size = int(np.prod(self._shapes[n])) if self._shapes[n] else 1
                own[n]._reset(self._flat[offset:offset + size].reshape(self._shapes[n]).astype(own[n].dtype))
                offset += size
            self._stale = False
        return self._module

    def state_dict(self):
        return {"module": {k: np.asarray(v) for k, v in self.module.state_dict().items()},
                "momentum": self.momentum, "updates": self.updates}

    def load_state_dict(self, state):
        self._module.load_state_dict(state["module"])
        self.momentum, self.updates = state.get("momentum", self.momentum), state.get("updates", 0)
        self._flat = self._gather(self._module)
        self._stale = False
