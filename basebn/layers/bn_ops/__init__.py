"""Moved to :mod:`basebn.ops.bn_ops`; this alias (and its submodules') goes in the next release."""
import sys
import warnings

from ...ops import bn_ops as _moved

warnings.warn("basebn.layers.bn_ops moved to basebn.ops.bn_ops: import it from there "
              "(this alias goes in the next release)", DeprecationWarning, stacklevel=2)
for _sub in ("backend", "fallback", "kernel", "ops"):  # all imported by basebn.ops.bn_ops itself
    sys.modules[f"{__name__}.{_sub}"] = sys.modules[f"{_moved.__name__}.{_sub}"]
sys.modules[__name__] = _moved
