"""BN layers with their activation (and optionally the residual add before it) fused in:
``forward(x, shortcut=None) = act(bn(x) [+ shortcut])``.

:class:`BatchNormAct2d` and :class:`SyncBatchNormAct2d` run the fused kernels
(:func:`.bn_act_function.kernel_bn_act_forward`); :class:`FrozenBatchNormAct2d` applies the activation after
its affine. Each is a subclass of its BN class adding only the plain attribute ``act`` (a name in
``bn_ops.ACTIVATIONS``): state dicts, ``isinstance`` checks, running-statistics updates, ``freeze`` and eval
behaviour are the BN class's. Under ``jit.trace`` the layer is MegEngine's BN op then the plain activation
(exports hold no custom op); ghost BN (``norm_batch_size``) runs unfused, and so does the residual form of SiLU
and HSwish (``bn_ops.PRE_GRAD_ACTIVATIONS``: fused BN, then the add and the activation as plain ops).

Whatever replaces a BN layer (SyncBN / FrozenBN conversion, conv-BN fusion, deploy) keeps the activation
through :func:`carry_act`; models build their layers with :func:`with_act` and call them with
:func:`norm_act`, which also serves norms without a fused form (GN, BRN: norm, then add, then activation).
"""
from typing import Any, Optional, Tuple

import megengine as mge
import megengine.functional as F
import megengine.module as M
from megengine.jit import tracing

from .activation import PassThrough, build_activation
from .batch_norm import BatchNorm2d
from .bn_act_function import kernel_bn_act_forward
from ..ops.bn_ops import ACTIVATIONS, PRE_GRAD_ACTIVATIONS
from .frozen_bn import FrozenBatchNorm2d
from .sync_bn import SyncBatchNorm

__all__ = ["BatchNormAct2d", "SyncBatchNormAct2d", "FrozenBatchNormAct2d", "NormActTail", "has_act", "with_act",
           "carry_act", "norm_act", "norm_then_act", "apply_act"]

_FUNCTIONS = {"identity": lambda v: v, "relu": F.relu, "relu6": F.relu6, "silu": F.silu, "hswish": F.hswish}


ACT_ALIASES = {"swish": "silu"}  # other names of a fused activation (basebn.layers.activation's)


def _check_act(act):
    if act not in ACTIVATIONS:
        raise ValueError(f"fused BN activation must be one of {ACTIVATIONS}, got {act!r}")
    return act


def apply_act(y: mge.Tensor, act: str, shortcut: Optional[mge.Tensor] = None) -> mge.Tensor:
    """``act(y [+ shortcut])`` with plain MegEngine ops.

    Args:
        y: a norm's output.
        act: one of ``bn_ops.ACTIVATIONS``.
        shortcut: a residual added before the activation, or None.
    """
    if shortcut is not None:
        y = y + shortcut
    return _FUNCTIONS[act](y)


class _NormAct:
    """Mixin: the activation ``act`` after the normalisation; :meth:`post_norm` is what follows it."""

    act = "relu"

    def post_norm(self, y, shortcut=None):
        """What the layer does after normalising: ``act(y [+ shortcut])`` (also used where the
        normalisation is folded into the conv)."""
        return apply_act(y, self.act, shortcut)

    def _check_shortcut(self, inp, shortcut):
        if shortcut is not None and tuple(shortcut.shape) != tuple(inp.shape):
            raise ValueError(f"shortcut {tuple(shortcut.shape)} must have the input's shape {tuple(inp.shape)}")

    def _unfused_residual(self, shortcut):
        """The add and the activation run as plain ops after the BN (SiLU / HSwish have no fused residual form)."""
        return shortcut is not None and self.act in PRE_GRAD_ACTIVATIONS

    def _module_info_string(self):
        return f"{super()._module_info_string()}, act={self.act}"


class BatchNormAct2d(_NormAct, BatchNorm2d):
    """:class:`.batch_norm.BatchNorm2d` followed by ``act`` (and a residual add before it), fused.

    Args:
        num_features: C.
        act: one of ``bn_ops.ACTIVATIONS``.
        eps: added to the variance.
        momentum: as BatchNorm2d's.
        **kwargs: to BatchNorm2d.

    Raises:
        ValueError: another act.
    """

    def __init__(self, num_features: int, act: str = "relu", eps: float = 1e-5, momentum: Optional[float] = 0.9,
                 **kwargs: Any):
        super().__init__(num_features, eps=eps, momentum=momentum, **kwargs)
        self.act = _check_act(act)

    def forward(self, inp, shortcut=None):
        if tracing.is_tracing() or (self.norm_batch_size is not None and self.training) or \
                self._unfused_residual(shortcut):
            return self.post_norm(BatchNorm2d.forward(self, inp), shortcut)
        self._check_input_ndim(inp)
        self._check_shortcut(inp, shortcut)
        return kernel_bn_act_forward(self, inp, self.act, shortcut)


class SyncBatchNormAct2d(_NormAct, SyncBatchNorm):
    """:class:`.sync_bn.SyncBatchNorm` followed by ``act`` (and a residual add before it), fused; the
    statistics collectives are SyncBatchNorm's.

    Args:
        num_features: C.
        act: one of ``bn_ops.ACTIVATIONS``.
        eps: added to the variance.
        momentum: as SyncBatchNorm's.
        **kwargs: to SyncBatchNorm.

    Raises:
        ValueError: another act.
    """

    def __init__(self, num_features: int, act: str = "relu", eps: float = 1e-5, momentum: Optional[float] = 0.9,
                 **kwargs: Any):
        super().__init__(num_features, eps=eps, momentum=momentum, **kwargs)
        self.act = _check_act(act)

    def forward(self, inp, shortcut=None):
        if self._unfused_residual(shortcut):
            return self.post_norm(SyncBatchNorm.forward(self, inp), shortcut)
        self._check_input_ndim(inp)
        self._check_shortcut(inp, shortcut)
        return kernel_bn_act_forward(self, inp, self.act, shortcut, sync=self.training and not self.local_only,
                                     group=self.group)


class FrozenBatchNormAct2d(_NormAct, FrozenBatchNorm2d):
    """:class:`.frozen_bn.FrozenBatchNorm2d` followed by ``act`` (not fused: an affine and an activation).

    Args:
        num_features: C.
        act: one of ``bn_ops.ACTIVATIONS``.
        eps: added to the variance.
        **kwargs: to FrozenBatchNorm2d.

    Raises:
        ValueError: another act.
    """

    def __init__(self, num_features: int, act: str = "relu", eps: float = 1e-5, **kwargs: Any):
        super().__init__(num_features, eps=eps, **kwargs)
        self.act = _check_act(act)

    def forward(self, inp, shortcut=None):
        return self.post_norm(FrozenBatchNorm2d.forward(self, inp), shortcut)

    def to_batchnorm(self, norm_cls=M.BatchNorm2d, **kwargs):
        """:meth:`FrozenBatchNorm2d.to_batchnorm`, keeping the activation (:func:`carry_act`)."""
        return carry_act(self, FrozenBatchNorm2d.to_batchnorm(self, norm_cls, **kwargs))


class NormActTail(_NormAct, M.Module):
    """``act(norm(x) [+ shortcut])`` around a module without a fused form; its state-dict keys are ``norm``'s
    under ``norm.``.

    Args:
        norm: the module (``M.Identity`` where the BN was folded into its conv).
        act: one of ``bn_ops.ACTIVATIONS``.
        **kwargs: to ``megengine.module.Module``.

    Raises:
        ValueError: another act.
    """

    def __init__(self, norm: M.Module, act: str, **kwargs: Any):
        super().__init__(**kwargs)
        self.norm, self.act = norm, _check_act(act)

    def forward(self, inp, shortcut=None):
        return self.post_norm(self.norm(inp), shortcut)

    def _module_info_string(self):
        return f"act={self.act}"


_ACT_CLASSES = {BatchNorm2d: BatchNormAct2d, SyncBatchNorm: SyncBatchNormAct2d,
                FrozenBatchNorm2d: FrozenBatchNormAct2d}


def has_act(m: M.Module) -> bool:
    """``m`` applies an activation after its normalisation (a layer of this module).

    Args:
        m: any module.
    """
    return isinstance(m, _NormAct)


def _swap(m, act):
    cls = _ACT_CLASSES.get(type(m))
    if cls is None:
        return None
    m.__class__ = cls  # a subclass that adds only the `act` attribute: same tensors, flags, hooks
    m.act = _check_act(act)
    return m


def with_act(norm: M.Module, act: Optional[str]) -> M.Module:
    """``norm`` with ``act`` fused in when it has a fused form (basebn's BatchNorm2d, SyncBatchNorm,
    FrozenBatchNorm2d: the same object, its class swapped for the act subclass), else ``norm`` unchanged (GN,
    BRN, ...; :func:`norm_act` then applies the activation).

    Args:
        norm: a norm layer just built, of any kind.
        act: an activation name; one not in ``bn_ops.ACTIVATIONS`` leaves `norm` unchanged; "swish" is fused
            as "silu" (build_activation's alias).
    """
    act = ACT_ALIASES.get(act, act)
    if act not in ACTIVATIONS or has_act(norm):
        return norm
    swapped = _swap(norm, act)
    return norm if swapped is None else swapped


def norm_then_act(norm: M.Module, act: Optional[str], fuse: bool = True) -> Tuple[M.Module, M.Module]:
    """``(norm, act module)`` for a norm followed by activation ``act``: the norm with ``act`` fused in and a
    :class:`.activation.PassThrough` (an ``Identity`` without MegEngine's copy), or (``fuse`` False, no fused
    form) the norm as built and ``build_activation(act)``. A block's last norm fuses only when nothing (SE,
    drop path) sits between it and the residual add; it adds the shortcut then (:func:`norm_act`).

    Args:
        norm: a norm layer just built.
        act: an activation name, or None.
        fuse: fuse the activation where the norm has a fused form.
    """
    if fuse and isinstance(act, str):
        norm = with_act(norm, act)
    return (norm, PassThrough()) if has_act(norm) else (norm, build_activation(act))


def carry_act(src: M.Module, dst: M.Module) -> M.Module:
    """``dst``, a replacement of layer ``src``, applying ``src``'s activation too.

    Args:
        src: the layer replaced.
        dst: its replacement.

    Returns:
        ``dst`` itself (act subclass of its class) or a :class:`NormActTail` around it; ``dst`` when ``src``
        has no activation.
    """
    if not has_act(src) or has_act(dst):
        return dst
    swapped = _swap(dst, src.act)
    return NormActTail(dst, src.act) if swapped is None else swapped


def norm_act(norm: M.Module, x: mge.Tensor, act: str, shortcut: Optional[mge.Tensor] = None) -> mge.Tensor:
    """``act(norm(x) [+ shortcut])``: one fused call when ``norm`` carries ``act`` (:func:`with_act`), else
    the norm, the add and the activation as plain ops.

    Args:
        norm: the norm layer.
        x: its input.
        act: the activation.
        shortcut: a residual added before the activation, or None.

    Raises:
        ValueError: ``norm`` carries another activation.
    """
    if has_act(norm):
        if norm.act != ACT_ALIASES.get(act, act):
            raise ValueError(f"{type(norm).__name__} applies {norm.act!r}, the caller asked for {act!r}")
        return norm(x) if shortcut is None else norm(x, shortcut)
    return apply_act(norm(x), act, shortcut)
