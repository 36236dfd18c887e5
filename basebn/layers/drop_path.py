"""Stochastic depth (drop path): zero a whole residual branch per sample while training."""
import megengine as mge
import megengine.module as M
import megengine.random as R

__all__ = ["DropPath", "drop_path"]


def drop_path(x: mge.Tensor, drop_prob: float, training: bool) -> mge.Tensor:
    """Each sample of `x` zeroed with probability `drop_prob`, survivors scaled by 1 / (1 - drop_prob);
    `x` itself when not training or drop_prob is 0.

    Args:
        x: (N, ...), a residual branch's output.
        drop_prob: the probability of dropping a sample.
        training: whether the model trains.
    """
    if not training or drop_prob == 0.0:
        return x
    keep = 1.0 - drop_prob
    mask = (R.uniform(size=(x.shape[0],) + (1,) * (x.ndim - 1)) < keep).astype(x.dtype)
    return x * mask / keep


class DropPath(M.Module):
    """:func:`drop_path` as a module (identity in eval mode); holds no parameters.

    Args:
        drop_prob: the probability of dropping a sample.
    """

    def __init__(self, drop_prob: float = 0.0):
        super().__init__()
        self.drop_prob = float(drop_prob)

    def forward(self, x):
        return drop_path(x, self.drop_prob, self.training)

    def _module_info_string(self):
        return f"drop_prob={self.drop_prob}"
