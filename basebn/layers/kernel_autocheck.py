"""Moved to :mod:`basebn.ops.kernel_autocheck`; this alias goes in the next release."""
import sys
import warnings

from ..ops import kernel_autocheck as _moved

warnings.warn("basebn.layers.kernel_autocheck moved to basebn.ops.kernel_autocheck: import it from there "
              "(this alias goes in the next release)", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
