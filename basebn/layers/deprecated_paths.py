"""The ops' old import paths under basebn.layers (``basebn.layers.conv_ops``, ``basebn.layers.bn_ops.kernel``, ...):
importing one gives basebn.ops's module itself, with a DeprecationWarning naming the new path. They go in the next
release.

One import-system finder, ahead of the path finder, serves them all, so basebn/layers holds no file of the ops.
"""
import importlib
import importlib.abc
import importlib.util
import sys
import warnings

__all__ = ["MOVED", "install"]

MOVED = ("bn_ops", "conv_ops", "pool_ops", "matmul_ops", "kernel_build", "kernel_library", "kernel_selfcheck",
         "kernel_autocheck")
"""The modules of basebn.ops that basebn.layers held."""
_OLD, _NEW = "basebn.layers.", "basebn.ops."


class _MovedOpsFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``basebn.layers.<moved>[.sub]`` and loads it as the module ``basebn.ops.<moved>[.sub]``."""

    def __init__(self):
        self._real_specs = {}

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(_OLD) and fullname[len(_OLD):].split(".")[0] in MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        rest = spec.name[len(_OLD):]
        top = rest.split(".")[0]
        warnings.warn(f"{_OLD}{top} moved to {_NEW}{top}: import it from there (this alias goes in the next "
                      f"release)", DeprecationWarning, stacklevel=2)
        module = importlib.import_module(_NEW + rest)
        self._real_specs[module.__name__] = module.__spec__
        if rest == top and hasattr(module, "__path__"):
            # its submodules imported already get their old names now: the import system then finds them in
            # sys.modules and does not set them on the package over its same-named functions (bn_ops.backend)
            for name in [n for n in sys.modules if n.startswith(module.__name__ + ".")]:
                sys.modules[_OLD + top + name[len(module.__name__):]] = sys.modules[name]
        return module

    def exec_module(self, module):
        # the import system set the alias's spec on the real module: give it back its own
        module.__spec__ = self._real_specs.pop(module.__name__)


_FINDER = _MovedOpsFinder()


def install():
    """Put the finder first on sys.meta_path (once), so the old paths reach basebn.ops."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
