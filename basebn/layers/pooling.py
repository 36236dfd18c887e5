"""Global and adaptive average pooling that also work on feature maps smaller than the output.

MegEngine's AdaptiveAvgPool2d cannot enlarge (VGG's 7x7 head pool on a 1x1 map of a 32 px
input); :class:`AdaptiveAvgPool2d` here uses PyTorch's bins (start = floor(i*H/out),
end = ceil((i+1)*H/out)), computed as two small averaging matrices: out = P_h @ x @ P_w^T.
"""
import math
from typing import Sequence, Union

import numpy as np

import megengine as mge
import megengine.functional as F
import megengine.module as M

__all__ = ["GlobalAvgPool2d", "AdaptiveAvgPool2d", "adaptive_pool_matrix"]


def adaptive_pool_matrix(size_in: int, size_out: int) -> np.ndarray:
    """(size_out, size_in) float32 matrix whose row i averages PyTorch's adaptive bin i.

    Args:
        size_in: the input's size along one axis.
        size_out: the output's.
    """
    mat = np.zeros((size_out, size_in), np.float32)
    for i in range(size_out):
        start, end = (i * size_in) // size_out, math.ceil((i + 1) * size_in / size_out)
        mat[i, start:end] = 1.0 / (end - start)
    return mat


class GlobalAvgPool2d(M.Module):
    """(N, C, H, W) -> (N, C, 1, 1) mean over H and W."""

    def forward(self, x):
        return F.mean(x, axis=(2, 3), keepdims=True)


class AdaptiveAvgPool2d(M.Module):
    """Adaptive average pooling to `output_size` with PyTorch's bins, any input size.

    Args:
        output_size: an int, or (h, w).
    """

    def __init__(self, output_size: Union[int, Sequence[int]]):
        super().__init__()
        self.output_size = tuple(output_size) if isinstance(output_size, (tuple, list)) else (output_size,) * 2

    def forward(self, x):
        h, w = int(x.shape[2]), int(x.shape[3])  # plain ints also under traced_module (shapes are tensors there)
        oh, ow = self.output_size
        if (h, w) == (oh, ow):
            return x
        if h % oh == 0 and w % ow == 0:
            return F.avg_pool2d(x, (h // oh, w // ow))
        ph = mge.tensor(adaptive_pool_matrix(h, oh), device=x.device)
        pw = mge.tensor(adaptive_pool_matrix(w, ow).T, device=x.device)
        return F.matmul(F.matmul(ph, x), pw)  # broadcast over (N, C)

    def _module_info_string(self):
        return f"output_size={self.output_size}"
