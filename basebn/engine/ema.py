"""Model EMA (timm's ModelEma; pycls/basecls momentum and schedule), vectorised.

``ModelEMA(model, momentum)`` keeps ``ema.module``, an eval-mode copy, and ``ema.update(model)`` does
``e = m * e + (1 - m) * p`` for every parameter and floating-point buffer in ONE flat buffer (a few ops
whatever the model size). The module's tensors are refreshed from it lazily, when ``ema.module`` is
read (an eager refresh costs 2-5% of a ResNet-20 CPU step, benchmarks/bench_ema.py); who holds the
values is a two-state table in :class:`ModelEMA`. Read ``ema.module`` again after updates rather than
keeping an older reference. Design notes: docs/bn_design.md, "Model EMA".
"""
import copy
import weakref
from typing import Any, Dict, Optional

import numpy as np

import megengine as mge
import megengine.functional as F
import megengine.module as M
from megengine.functional.inplace import _inplace_add_

__all__ = ["ModelEMA", "pycls_momentum", "ema_should_update"]


def pycls_momentum(alpha: float, total_batch_size: int, max_epoch: int, update_period: int) -> float:
    """EMA momentum from pycls's alpha: ``max(0, 1 - alpha * total_batch_size / max_epoch * update_period)``.

    pycls (``ema_alpha``) and basecls (``model_ema.alpha``) use this so that the EMA's time horizon,
    measured in epochs, does not depend on the batch size or on how often the EMA is updated.
    ``pycls_momentum(1e-5, 1024, 100, 32) == 0.99672318``.

    Args:
        alpha: pycls's ``ema_alpha``.
        total_batch_size: samples per iteration over all ranks.
        max_epoch: epochs of the run.
        update_period: iterations between EMA updates.

    Returns:
        The momentum (weight of the old average).

    Raises:
        ValueError: max_epoch or update_period not positive.
    """
    if max_epoch <= 0 or update_period <= 0:
        raise ValueError(f"max_epoch and update_period must be positive, got {max_epoch}, {update_period}")
    return max(0.0, 1.0 - alpha * total_batch_size / max_epoch * update_period)


def ema_should_update(iter_global: int, epoch: int, start_epoch: Optional[int], update_period: int) -> str:
    """What the EMA hook does after iteration ``iter_global`` (0-based, counted over the whole run)
    of epoch ``epoch`` (0-based): ``"copy"``, ``"update"`` or ``"skip"``.

    Args:
        iter_global: the iteration, 0-based over the whole run.
        epoch: the epoch, 0-based.
        start_epoch: the first epoch that averages; 0 or None: the first.
        update_period: iterations between updates.

    Returns:
        ``"copy"``, ``"update"`` or ``"skip"``, by the rule below.

    Raises:
        ValueError: update_period below 1.

    * before ``start_epoch`` (0-based; ``0`` or ``None`` = from the very first epoch -- unlike
      basecls, where ``start_epoch or warmup_epochs`` turns 0 into the warm-up length): ``"copy"``
      after every iteration, so the EMA equals the model exactly until averaging starts (and when
      evaluated at the end of those epochs);
    * from ``start_epoch`` on: ``"update"`` after every ``update_period``-th iteration
      (``(iter_global + 1) % update_period == 0``), ``"skip"`` otherwise.
    """
    update_period = int(update_period)
    if update_period < 1:
        raise ValueError(f"update_period must be >= 1, got {update_period}")
    if epoch < (start_epoch or 0):
        return "copy"
    return "update" if (iter_global + 1) % update_period == 0 else "skip"


def _is_float(t):
    return np.issubdtype(np.dtype(t.dtype), np.floating)


def _named_tensors(module):
    """Parameters then buffers, by name, each tensor once (a shared tensor under its first name)."""
    seen, out = set(), []
    for name, t in list(module.named_parameters()) + list(module.named_buffers()):
        if id(t) not in seen:
            seen.add(id(t))
            out.append((name, t))
    return out


_FLAT, _MODULE = "flat", "module"  # who holds the current averaged values (see ModelEMA)


class ModelEMA:
    """Exponential moving average of a model's parameters and buffers (see module doc).

    Args:
        model: the megengine Module being trained.
        momentum: weight of the old average, ``e = m * e + (1 - m) * p`` (default 0.9999).
        copy_buffers: copy buffers from the model instead of averaging them.

    Attributes: ``module`` (the averaged model, eval mode), ``momentum``, ``updates`` (number of
    averaging updates so far; copies do not count), ``copy_buffers``.

    The current values live in one of two places (``_holder``); two methods move them:

    ===========  ==========================================  =================================
    ``_holder``  the current values are in                   entered by
    ===========  ==========================================  =================================
    "module"     ``module``'s tensors (the caller may have   ``__init__``, reading ``module``
                 changed them since: precise BN, loading)    (:meth:`_hand_to_module`)
    "flat"       the flat buffer ``_flat``; ``module``'s     ``update``, ``copy_from``
                 tensors are stale                           (:meth:`_take_from_module` first)
    ===========  ==========================================  =================================

    Reading ``module`` (``state_dict`` and ``load_state_dict`` read it too) hands the values to the
    module, since whoever reads it may change it; the next ``update`` takes them back. So read
    ``ema.module`` again after updates rather than keeping a reference from before.
    """

    def __init__(self, model: M.Module, momentum: float = 0.9999, *, copy_buffers: bool = False):
        self.momentum = float(momentum)
        self.copy_buffers = bool(copy_buffers)
        self.updates = 0
        self._module = copy.deepcopy(model)
        self._module.eval()
        named = _named_tensors(self._module)
        params = {id(t) for t in self._module.parameters()}
        self._float_names = [n for n, t in named if _is_float(t)]
        self._int_names = [n for n, t in named if not _is_float(t)]
        tensors = dict(named)
        self._shapes = [tuple(tensors[n].shape) for n in self._float_names]
        self._sizes = [int(np.prod(s)) if s else 1 for s in self._shapes]
        self._dtypes = [np.dtype(tensors[n].dtype) for n in self._float_names]
        averaged = [id(tensors[n]) in params or not self.copy_buffers for n in self._float_names]
        self._all_averaged = all(averaged)
        self._mask = np.repeat(np.asarray(averaged, dtype=np.float32), self._sizes)
        self._mvec = None  # (momentum, per-element momentum tensors) when some values are copied
        self._src = None  # (weakref to the last model, its tensors in _float_names order, its int tensors)
        self._holder = _MODULE  # the copy holds the values; the first update gathers them
        self._flat = None  # the values while _holder is "flat"
        self._own = self._own_int = None  # the module's tensors, bound by _take_from_module

    # -- who holds the values ----------------------------------------------------------------------
    def _take_from_module(self):
        """From "module" to "flat": gather the module's tensors (re-bound by name: they may have been replaced,
        not just refilled) into the flat buffer. Nothing to do when the flat buffer holds them."""
        if self._holder == _FLAT:
            return
        tensors = dict(_named_tensors(self._module))
        self._own = [tensors[n] for n in self._float_names]
        self._own_int = [tensors[n] for n in self._int_names]
        self._flat = self._gather(self._own)
        self._holder = _FLAT

    def _hand_to_module(self):
        """From "flat" to "module": write the flat buffer into the module's tensors (one split, one reshape
        per tensor). Nothing to do when the module holds the values."""
        if self._holder == _MODULE:
            return
        if len(self._own) > 1:
            pieces = F.split(self._flat, list(np.cumsum(self._sizes)[:-1]))
        else:  # (F.split needs two pieces at least)
            pieces = [self._flat] * len(self._own)
        for t, piece, shape, dtype in zip(self._own, pieces, self._shapes, self._dtypes):
            value = piece.reshape(shape)
            t._reset(value if dtype == np.float32 else value.astype(dtype))
        self._flat = None
        self._holder = _MODULE

    # -- plumbing --------------------------------------------------------------------------------
    def _gather(self, tensors):
        """One flat float32 tensor of ``tensors`` (one concat; casts only where needed)."""
        parts = [(t if t.dtype == np.float32 else t.astype("float32")).reshape(-1) for t in tensors]
        if not parts:
            return mge.tensor(np.zeros((0,), np.float32))
        return F.concat(parts).detach()

    def _model_tensors(self, model):
        """``model``'s tensors matching ours (cached per model object; rebuilt when the model changes)."""
        src = self._src
        if src is not None and src[0]() is model:
            return src[1], src[2]
        tensors = dict(_named_tensors(model))
        missing = [n for n in self._float_names + self._int_names if n not in tensors]
        if missing:
            raise KeyError(f"ModelEMA: the model has no tensor(s) {', '.join(missing[:10])}; "
                           f"was it built like the one the EMA was created from?")
        floats = [tensors[n] for n in self._float_names]
        for n, t, shape in zip(self._float_names, floats, self._shapes):
            if tuple(t.shape) != shape:
                raise ValueError(f"ModelEMA: {n} has shape {tuple(t.shape)} in the model, {shape} in the EMA")
        ints = [tensors[n] for n in self._int_names]
        self._src = (weakref.ref(model), floats, ints)
        return floats, ints

    def _momentum_vectors(self, m):
        """Per-element (m, 1 - m) where averaged, (0, 1) where copied; cached per momentum value."""
        if self._mvec is None or self._mvec[0] != m:
            keep = (self._mask * np.float32(m)).astype(np.float32)
            take = np.where(self._mask > 0, np.float32(1.0 - m), np.float32(1.0)).astype(np.float32)
            dev = self._flat.device
            self._mvec = (m, mge.tensor(keep, device=dev), mge.tensor(take, device=dev))
        return self._mvec[1], self._mvec[2]

    def _copy_ints(self, ints):
        for own, src in zip(self._own_int, ints):
            own._reset(F.copy(src.detach()))  # a copy: the model may change its tensor in place

    # -- public API ------------------------------------------------------------------------------
    def update(self, model: M.Module, momentum: Optional[float] = None) -> None:
        """``e = m * e + (1 - m) * p`` for every parameter and float buffer of ``model``
        (buffers copied with ``copy_buffers``; integer buffers always copied).

        Args:
            model: the model being trained (the one the EMA was made from, or one of the same structure).
            momentum: this update's momentum; None: ``self.momentum``.
        """
        m = self.momentum if momentum is None else float(momentum)
        self._take_from_module()
        floats, ints = self._model_tensors(model)
        new = self._gather(floats)
        if self._all_averaged and len(self._float_names) > 1:
            # one fused op written into the fresh concat (a single tensor's "concat" may alias the model's)
            self._flat = _inplace_add_(new, self._flat, alpha=mge.tensor(1.0 - m, dtype="float32"),
                                       beta=mge.tensor(m, dtype="float32"))
        elif self._all_averaged:
            self._flat = (self._flat * m + new * (1.0 - m)).detach()
        else:
            keep, take = self._momentum_vectors(m)
            self._flat = (self._flat * keep + new * take).detach()
        self._copy_ints(ints)
        self.updates += 1

    def copy_from(self, model: M.Module) -> None:
        """Make the EMA an exact copy of ``model``'s parameters and buffers (used before start_epoch).

        Args:
            model: the model being trained.
        """
        self._take_from_module()
        floats, ints = self._model_tensors(model)
        self._flat = self._gather(floats)
        self._copy_ints(ints)

    @property
    def module(self):
        """The averaged model (eval mode), with current values; it now holds them, so changes to it are
        kept (the next update starts from them). Read it again after updates."""
        self._hand_to_module()
        return self._module

    def state_dict(self) -> Dict[str, Any]:
        """``{"module": {name: numpy array}, "momentum": float, "updates": int}``."""
        return {"module": {k: np.asarray(v) for k, v in self.module.state_dict().items()},
                "momentum": self.momentum, "updates": int(self.updates)}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Load a :meth:`state_dict` (or a bare module state dict: only the weights are loaded).

        Args:
            state: a :meth:`state_dict`, or a module state dict.
        """
        if "module" in state and isinstance(state["module"], dict):
            self.module.load_state_dict(state["module"])
            self.momentum = float(state.get("momentum", self.momentum))
            self.updates = int(state.get("updates", self.updates))
        else:
            self.module.load_state_dict(state)
