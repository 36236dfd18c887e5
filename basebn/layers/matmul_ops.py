"""Moved to :mod:`basebn.ops.matmul_ops`; this alias goes in the next release."""
import sys
import warnings

from ..ops import matmul_ops as _moved

warnings.warn("basebn.layers.matmul_ops moved to basebn.ops.matmul_ops: import it from there "
              "(this alias goes in the next release)", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
