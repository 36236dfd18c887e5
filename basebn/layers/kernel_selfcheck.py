"""Moved to :mod:`basebn.ops.kernel_selfcheck`; this alias goes in the next release."""
import sys
import warnings

from ..ops import kernel_selfcheck as _moved

warnings.warn("basebn.layers.kernel_selfcheck moved to basebn.ops.kernel_selfcheck: import it from there "
              "(this alias goes in the next release)", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
