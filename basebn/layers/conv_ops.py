"""Moved to :mod:`basebn.ops.conv_ops`; this alias goes in the next release."""
import sys
import warnings

from ..ops import conv_ops as _moved

warnings.warn("basebn.layers.conv_ops moved to basebn.ops.conv_ops: import it from there "
              "(this alias goes in the next release)", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
