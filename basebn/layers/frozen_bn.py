"""FrozenBatchNorm2d: BatchNorm with fixed statistics and affine, for fine-tuning.

``y = x * s + (beta - mu * s)``, ``s = gamma / sqrt(var + eps)``, in train and eval mode alike.
All four tensors are buffers (no gradient, no optimizer), with BatchNorm2d's state-dict keys and
shapes: it derives from MegEngine's ``_BatchNorm`` only for that (C,) <-> (1, C, 1, 1) reshape rule.
Model-wide conversions are in :mod:`basebn.layers.convert`.
"""
from typing import Any

import numpy as np

import megengine as mge
import megengine.module as M
from megengine.module.batchnorm import _BatchNorm

__all__ = ["FrozenBatchNorm2d"]

_VALUE_NAMES = ("weight", "bias", "running_mean", "running_var")


def _bn_values(bn):
    """{weight, bias, running_mean, running_var} of a BN-like module as (1, C, 1, 1) float32 arrays
    (defaults 1, 0, 0, 1 for those it lacks)."""
    c = bn.num_features
    out = {}
    for name, default in zip(_VALUE_NAMES, (1.0, 0.0, 0.0, 1.0)):
        t = getattr(bn, name, None)
        out[name] = (np.full((1, c, 1, 1), default, np.float32) if t is None
                     else t.numpy().astype(np.float32).reshape(1, c, 1, 1))
    return out


class FrozenBatchNorm2d(_BatchNorm):
    """BatchNorm2d with frozen statistics and affine; `training` does not change its output.

    Args:
        num_features: C.
        eps: added to the variance.
        **kwargs: to ``megengine.module.Module``.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, **kwargs: Any):
        M.Module.__init__(self, **kwargs)  # not _BatchNorm's: it would make weight and bias Parameters
        self.num_features = num_features
        self.eps = eps
        self.momentum = None
        self.affine = True
        self.track_running_stats = self._track_running_stats_saved = True
        self.freeze = False
        shape = (1, num_features, 1, 1)
        self.weight = mge.Tensor(np.ones(shape, np.float32))
        self.bias = mge.Tensor(np.zeros(shape, np.float32))
        self.running_mean = mge.Tensor(np.zeros(shape, np.float32))
        self.running_var = mge.Tensor(np.ones(shape, np.float32))

    def scale_shift(self):
        """(s, t) with forward(x) = x * s + t, each (1, C, 1, 1)."""
        scale = self.weight * (self.running_var + self.eps) ** -0.5
        return scale, self.bias - self.running_mean * scale

    def forward(self, inp):
        if inp.ndim != 4:
            raise ValueError(f"expected 4D input (got {inp.ndim}D input)")
        scale, shift = self.scale_shift()
        return inp * scale + shift

    def reset_running_stats(self):
        """Running mean 0, running variance 1."""
        self.running_mean._reset(mge.Tensor(np.zeros(self.running_mean.shape, np.float32)))
        self.running_var._reset(mge.Tensor(np.ones(self.running_var.shape, np.float32)))

    def reset_parameters(self):
        """Running statistics reset, weight 1, bias 0."""
        self.reset_running_stats()
        self.weight._reset(mge.Tensor(np.ones(self.weight.shape, np.float32)))
        self.bias._reset(mge.Tensor(np.zeros(self.bias.shape, np.float32)))

    def _module_info_string(self):
        return f"{self.num_features}, eps={self.eps}"

    @classmethod
    def from_batchnorm(cls, bn):
        """A FrozenBatchNorm2d with `bn`'s values (affine=False: weight 1, bias 0; no running stats: 0, 1)."""
        frozen = cls(bn.num_features, eps=bn.eps)
        frozen.load_state_dict(_bn_values(bn))
        frozen.training = bn.training
        return frozen

    def to_batchnorm(self, norm_cls=M.BatchNorm2d, **kwargs):
        """A trainable `norm_cls` (default BatchNorm2d) with this module's values; kwargs go to its constructor."""
        bn = norm_cls(self.num_features, eps=self.eps, **kwargs)
        bn.load_state_dict({k: v for k, v in _bn_values(self).items() if getattr(bn, k, None) is not None})
        bn.training = self.training
        return bn
