"""Moved to :mod:`basebn.ops.pool_ops`; this alias goes in the next release."""
import sys
import warnings

from ..ops import pool_ops as _moved

warnings.warn("basebn.layers.pool_ops moved to basebn.ops.pool_ops: import it from there "
              "(this alias goes in the next release)", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
