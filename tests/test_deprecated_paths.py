"""The ops' old import paths under basebn.layers: each still imports, warns once with DeprecationWarning naming the
new path, and is the new module itself (so monkeypatching the old name patches what the code runs)."""
import importlib
import os
import sys

import pytest

from tests.support import ROOT

OLD_TO_NEW = {f"basebn.layers.{name}": f"basebn.ops.{name}" for name in (
    "bn_ops", "conv_ops", "pool_ops", "matmul_ops", "kernel_build", "kernel_library", "kernel_selfcheck",
    "kernel_autocheck")}
OLD_TO_NEW.update({f"basebn.layers.bn_ops.{name}": f"basebn.ops.bn_ops.{name}"
                   for name in ("backend", "fallback", "kernel", "ops")})


@pytest.fixture
def forget_old_paths():
    """Each old path imported afresh (its alias runs again), and no alias left behind for other tests."""
    def drop():
        for name in OLD_TO_NEW:
            sys.modules.pop(name, None)
        layers = importlib.import_module("basebn.layers")
        for name in OLD_TO_NEW:
            if name.count(".") == 2:
                layers.__dict__.pop(name.rsplit(".", 1)[1], None)
    drop()
    yield
    drop()


@pytest.mark.parametrize("old", sorted(OLD_TO_NEW))
def test_old_path_warns_and_is_the_new_module(forget_old_paths, old):
    new = importlib.import_module(OLD_TO_NEW[old])
    package = old if old.count(".") == 2 else old.rsplit(".", 1)[0]  # a submodule's alias is its package's
    with pytest.warns(DeprecationWarning, match=f"{package} moved to {package.replace('layers', 'ops')}"):
        got = importlib.import_module(old)
    assert got is new


def test_monkeypatching_the_old_name_patches_the_new_module(forget_old_paths, monkeypatch):
    new = importlib.import_module("basebn.ops.kernel_library")
    with pytest.warns(DeprecationWarning):
        import basebn.layers.kernel_library as old
    monkeypatch.setattr(old, "kernel_error", lambda: "patched")
    assert new.kernel_error() == "patched"


def test_from_layers_import_an_old_name_warns(forget_old_paths):
    with pytest.warns(DeprecationWarning, match="basebn.layers.conv_ops moved"):
        from basebn.layers import conv_ops
    assert conv_ops is importlib.import_module("basebn.ops.conv_ops")


def test_layers_holds_no_file_of_the_ops():
    """basebn/layers keeps nn modules, Functions and model-wide BN tools: no *_ops, kernel_* or bn_ops there; the old
    paths above come from basebn.layers.deprecated_paths's finder."""
    layers = os.path.join(ROOT, "basebn", "layers")
    names = os.listdir(layers)
    assert not [n for n in names if n.endswith("_ops.py") or n.startswith("kernel_") or n == "bn_ops"]


def test_an_old_path_keeps_the_new_modules_spec(forget_old_paths):
    """The alias does not leave its own name on the module (pickling and importlib.reload go by __spec__)."""
    new = importlib.import_module("basebn.ops.bn_ops.kernel")
    with pytest.warns(DeprecationWarning):
        old = importlib.import_module("basebn.layers.bn_ops.kernel")
    assert old is new and new.__spec__.name == "basebn.ops.bn_ops.kernel" and new.__name__ == new.__spec__.name
    assert importlib.reload(new) is new


def test_an_old_submodule_path_leaves_the_packages_functions_alone(forget_old_paths):
    """basebn.ops.bn_ops.backend is a function and the name of a submodule: importing the old submodule path must
    not put the submodule on the package in its place."""
    bn_ops = importlib.import_module("basebn.ops.bn_ops")
    function = bn_ops.backend
    with pytest.warns(DeprecationWarning):
        importlib.import_module("basebn.layers.bn_ops.backend")
    assert bn_ops.backend is function and callable(bn_ops.backend)


def test_a_name_not_moved_is_not_found():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("basebn.layers.no_such_ops")
