"""Moved to :mod:`basebn.ops.kernel_build`; this alias goes in the next release."""
import sys
import warnings

from ..ops import kernel_build as _moved

warnings.warn("basebn.layers.kernel_build moved to basebn.ops.kernel_build: import it from there "
              "(this alias goes in the next release)", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
