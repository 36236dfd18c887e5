"""The package's structure, read from the source: dependencies point one way, no import cycles, no imports
inside functions except optional dependencies. Reference: the layering declared here (docs/layout.md lists it)."""
import ast
import importlib.util
import os

import pytest

from tests.support import ROOT

_spec = importlib.util.spec_from_file_location("import_graph", os.path.join(ROOT, "scripts", "import_graph.py"))
import_graph = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(import_graph)

# bottom to top: a package may import only packages before it
LAYERS = ["basebn.utils", "basebn.distributed", "basebn.ops", "basebn.layers", "basebn.data", "basebn.checkpoint",
          "basebn.zoo", "basebn.models", "basebn.config", "basebn.engine", "basebn.cli", "basebn.train",
          "basebn.deploy", "basebn.test", "basebn.tools"]


@pytest.fixture(scope="module")
def modules():
    return import_graph.scan(os.path.join(ROOT, "basebn"))


def test_every_package_is_placed_in_the_layering(modules):
    packages = {import_graph.package_of(m) for m in modules} - {"basebn"}
    assert packages <= set(LAYERS), f"not in LAYERS: {sorted(packages - set(LAYERS))}"


def test_dependencies_point_one_way(modules):
    rank = {p: i for i, p in enumerate(LAYERS)}
    upward = [f"{a} -> {b}" for a, bs in import_graph.package_arrows(modules).items() for b in bs
              if a in rank and b in rank and rank[b] >= rank[a]]
    assert upward == []


def test_no_module_import_cycle(modules):
    graph = {m: {d for d in info["imports"] if d != m and not m.startswith(d + ".")} for m, info in modules.items()}
    assert import_graph.cycles(graph) == []


def test_no_imports_inside_functions(modules):
    assert import_graph.lazy_imports(modules) == []


@pytest.mark.parametrize("module, peer, shared", [
    ("basebn.layers.batch_norm", "basebn.layers.sync_bn", "basebn.layers.bn_function"),
    ("basebn.ops.conv_ops", "basebn.ops.bn_ops", "basebn.ops.kernel_library"),
])
def test_peers_share_a_module_instead_of_importing_each_other(modules, module, peer, shared):
    """BatchNorm2d and SyncBatchNorm both build on bn_function; the conv ops and the BN ops both on kernel_library."""
    imports = modules[module]["imports"]
    assert sorted(d for d in imports if d == peer or d.startswith(peer + ".")) == []
    assert shared in imports


def test_the_checker_sees_a_cycle_and_a_lazy_import(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from . import a\n    import json\n")
    mods = import_graph.scan(str(pkg))
    graph = {m: set(info["imports"]) - {m, "pkg"} for m, info in mods.items()}
    assert import_graph.cycles(graph) == [["pkg.a", "pkg.b"]]
    assert [(m, name) for m, _, name in import_graph.lazy_imports(mods)] == [("pkg.b", "pkg"), ("pkg.b", "json")]


def _undocumented(path):
    tree = ast.parse(open(path).read())
    names = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))
             and not n.name.startswith("_") and ast.get_docstring(n) is None]
    doc = ast.get_docstring(tree)
    if doc is None and not path.endswith("__init__.py"):
        names.append("<module docstring>")
    elif doc is not None and len(doc.splitlines()) > MAX_MODULE_DOC_LINES:
        names.append(f"<module docstring of {len(doc.splitlines())} lines: design notes go to docs/>")
    return names


MAX_MODULE_DOC_LINES = 18


def test_public_functions_and_classes_have_docstrings():
    missing = {}
    for folder, _, files in os.walk(os.path.join(ROOT, "basebn")):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                found = _undocumented(path)
                if found:
                    missing[os.path.relpath(path, ROOT)] = found
    assert missing == {}
