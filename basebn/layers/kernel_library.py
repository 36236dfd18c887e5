"""Moved to :mod:`basebn.ops.kernel_library`; this alias goes in the next release."""
import sys
import warnings

from ..ops import kernel_library as _moved

warnings.warn("basebn.layers.kernel_library moved to basebn.ops.kernel_library: import it from there "
              "(this alias goes in the next release)", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
