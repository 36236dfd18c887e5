"""FrozenBatchNorm2d: BatchNorm with fixed statistics and affine, for fine-tuning (detectron2-style).

y = x * s + (beta - mu * s),  s = gamma / sqrt(var + eps), in training and eval mode alike.
weight, bias, running_mean and running_var are buffers (plain Tensors, not Parameters): no optimizer
sees them, no gradient reaches them. Their state-dict keys and shapes are BatchNorm2d's, so
checkpoints load both ways: held as (1, C, 1, 1), saved as (C,) and loaded from either. That
reshape rule is MegEngine's for subclasses of its (private) `_BatchNorm`, which is why this class
derives from it, although it is not a BatchNorm2d and runs none of `_BatchNorm`'s code.
`convert_frozen_batchnorm` / `convert_to_batchnorm` switch a model's BNs between the two, keeping
values; `FrozenBatchNorm2d` in a model is efficient-conv-BN's `conv -> FrozenBN` pair case.
"""
import numpy as np

import megengine as mge
import megengine.module as M
from megengine.module.batchnorm import _BatchNorm

__all__ = ["FrozenBatchNorm2d"]


def _bn_values(bn):
    """weight, bias, running_mean, running_var of a BN-like module as (1, C, 1, 1) float32 arrays."""
    c = bn.num_features

    def get(name, default):
        t = getattr(bn, name, None)
        if t is None:
            return np.full((1, c, 1, 1), default, np.float32)
        return t.numpy().astype(np.float32).reshape(1, c, 1, 1)

    return get("weight", 1.0), get("bias", 0.0), get("running_mean", 0.0), get("running_var", 1.0)


def _convert_children(module, convert_one, should_convert):
    """Replace, in place, every descendant for which should_convert(child) by convert_one(child)."""
    from .graph import set_module

    for name, child in list(module.named_children()):
        if should_convert(child):
            set_module(module, name, convert_one(child))
        else:
            _convert_children(child, convert_one, should_convert)


def _keeping_efficient_pairs(module, fn):
    """Run fn(module) with efficient conv-BN pairs undone, then switch the same pairs back on."""
    from .conv_bn import disable_efficient_conv_bn_eval, enable_efficient_conv_bn_eval

    pairs = disable_efficient_conv_bn_eval(module)
    out = fn(module)
    if pairs:
        enable_efficient_conv_bn_eval(out, pairs=pairs)
    return out


class FrozenBatchNorm2d(_BatchNorm):
    """BatchNorm2d with frozen statistics and affine; `training` does not change its output."""

    def __init__(self, num_features, eps=1e-5, **kwargs):
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
        self.running_mean._reset(mge.Tensor(np.zeros(self.running_mean.shape, np.float32)))
        self.running_var._reset(mge.Tensor(np.ones(self.running_var.shape, np.float32)))

    def reset_parameters(self):
        self.reset_running_stats()
        self.weight._reset(mge.Tensor(np.ones(self.weight.shape, np.float32)))
        self.bias._reset(mge.Tensor(np.zeros(self.bias.shape, np.float32)))

    def _module_info_string(self):
        return f"{self.num_features}, eps={self.eps}"

    @classmethod
    def from_batchnorm(cls, bn):
        """A FrozenBatchNorm2d with `bn`'s values (affine=False: weight 1, bias 0; no running stats: 0, 1)."""
        frozen = cls(bn.num_features, eps=bn.eps)
        frozen.load_state_dict(dict(zip(("weight", "bias", "running_mean", "running_var"), _bn_values(bn))))
        frozen.training = bn.training
        return frozen

    def to_batchnorm(self, norm_cls=M.BatchNorm2d, **kwargs):
        """A trainable `norm_cls` (default BatchNorm2d) with this module's values; kwargs go to its constructor."""
        bn = norm_cls(self.num_features, eps=self.eps, **kwargs)
        values = dict(zip(("weight", "bias", "running_mean", "running_var"), _bn_values(self)))
        bn.load_state_dict({k: v for k, v in values.items() if getattr(bn, k, None) is not None})
        bn.training = self.training
        return bn

    unfreeze = to_batchnorm

    @classmethod
    def convert_frozen_batchnorm(cls, module):
        """Convert every BatchNorm2d-like module in `module` (BatchNorm2d, SyncBatchNorm) to FrozenBatchNorm2d.

        Returns a new FrozenBatchNorm2d if `module` itself is a BN; otherwise `module`, with its BN
        descendants replaced in place (as detectron2's `convert_frozen_batchnorm`). Values are kept;
        pairs switched by `enable_efficient_conv_bn_eval` stay switched (re-linked to the new modules).
        """
        from .graph import is_batchnorm2d

        def is_bn(m):
            return is_batchnorm2d(m) and not isinstance(m, cls)

        if is_bn(module):
            return cls.from_batchnorm(module)

        def convert(m):
            _convert_children(m, cls.from_batchnorm, is_bn)
            return m

        return _keeping_efficient_pairs(module, convert)

    @classmethod
    def convert_to_batchnorm(cls, module, norm_cls=M.BatchNorm2d, **kwargs):
        """Inverse of `convert_frozen_batchnorm`: every FrozenBatchNorm2d becomes a trainable `norm_cls`."""

        def is_frozen(m):
            return isinstance(m, cls)

        def to_bn(m):
            return m.to_batchnorm(norm_cls, **kwargs)

        if is_frozen(module):
            return to_bn(module)

        def convert(m):
            _convert_children(m, to_bn, is_frozen)
            return m

        return _keeping_efficient_pairs(module, convert)
