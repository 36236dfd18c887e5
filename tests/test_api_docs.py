"""The API reference (docs/api/, mkdocstrings) documents what it shows: every name a page renders (the
``__all__`` of a ``::: module`` block, the block's ``members:`` list, or the object a ``::: module.name`` block
names) has a docstring, and every function or class among them that takes arguments hints each argument's type
and names it in an ``Args:`` section.

Read from the source with ast, as mkdocstrings' griffe does: nothing is imported.
"""
import ast
import os
import re

import pytest

from tests.support import ROOT

API_DIR = os.path.join(ROOT, "docs", "api")
PUBLIC_PACKAGES = ("basebn.models", "basebn.layers", "basebn.ops", "basebn.engine", "basebn.distributed",
                   "basebn.tools")
BLOCK = re.compile(r"^:::\s+([\w.]+)\s*$")
ARG_LINE = re.compile(r"^\s+(\*{0,2}\w+)\s*(\([^)]*\))?\s*:")


def module_path(module):
    """The source file of a dotted module name (a package's __init__.py), or None."""
    base = os.path.join(ROOT, *module.split("."))
    for path in (os.path.join(base, "__init__.py"), base + ".py"):
        if os.path.isfile(path):
            return path
    return None


def page_blocks():
    """[(page, module, members or None)] for every ``::: module`` block of docs/api/*.md; a block naming one
    object of a module (``::: module.name``) is ``(page, module, [name])``."""
    blocks = []
    for name in sorted(os.listdir(API_DIR)):
        if not name.endswith(".md"):
            continue
        with open(os.path.join(API_DIR, name), encoding="utf-8") as f:
            lines = f.read().splitlines()
        for i, line in enumerate(lines):
            m = BLOCK.match(line)
            if not m:
                continue
            members, j = None, i + 1
            while j < len(lines) and lines[j].startswith(" "):
                if lines[j].strip() == "members:":
                    members = []
                elif members is not None and lines[j].strip().startswith("- "):
                    members.append(lines[j].strip()[2:].strip())
                j += 1
            target = m.group(1)
            if module_path(target) is None and module_path(target.rpartition(".")[0]) is not None:
                target, _, member = target.rpartition(".")
                members = [member]
            blocks.append((name, target, members))
    return blocks


def _parse(path):
    with open(path, encoding="utf-8") as f:
        return ast.parse(f.read())


def exported_names(module):
    """The module's ``__all__`` (a literal list or tuple), or None."""
    for node in _parse(module_path(module)).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    return None


def _import_source(node, module, is_package):
    """The absolute module an ImportFrom node imports from."""
    if node.level == 0:
        return node.module
    parts = module.split(".")
    keep = len(parts) - node.level + (1 if is_package else 0)
    return ".".join(parts[:keep] + ([node.module] if node.module else []))


def definition(module, name, depth=0):
    """(node, following statement or None, where) defining `name` in `module`, following ``from . import``
    re-exports; None when it is defined nowhere in basebn."""
    path = module_path(module)
    if path is None or depth > 8:
        return None
    body = _parse(path).body
    is_package = path.endswith("__init__.py")
    for i, node in enumerate(body):
        after = body[i + 1] if i + 1 < len(body) else None
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return node, after, f"{module}.{name}"
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return node, after, f"{module}.{name}"
    for node in body:
        if isinstance(node, ast.ImportFrom):
            source = _import_source(node, module, is_package)
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    if module_path(f"{source}.{alias.name}"):  # `from . import submodule`
                        return _module_node(f"{source}.{alias.name}")
                    return definition(source, alias.name, depth + 1)
    return None


def _module_node(module):
    return _parse(module_path(module)), None, module


def documented_names():
    """[(where, name, node, following statement)] for every name the API pages render."""
    out = []
    for page, module, members in page_blocks():
        if module_path(module) is None:
            continue  # test_every_page_block_names_a_module_with_its_public_names reports it
        names = members if members is not None else exported_names(module)
        for name in names or []:
            found = definition(module, name)
            out.append((f"{page}: {module}", name) + ((found[0], found[1]) if found else (None, None)))
    return out


def _docstring(node, after):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)):
        return ast.get_docstring(node)
    # an attribute's docstring: the string literal right after its assignment (griffe's rule)
    if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
        return after.value.value
    return None


def _signature_of(node):
    """(function whose parameters document `node`, docstrings that may hold its Args:), or (None, [])."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return node, [ast.get_docstring(node)]
    if isinstance(node, ast.ClassDef):
        init = next((b for b in node.body if isinstance(b, ast.FunctionDef) and b.name == "__init__"), None)
        if init is not None:
            return init, [ast.get_docstring(node), ast.get_docstring(init)]
    return None, []


def parameters(fn):
    a = fn.args
    params = a.posonlyargs + a.args + a.kwonlyargs
    if fn.name == "__init__":
        params = params[1:]  # self
    named = [(p.arg, p) for p in params]
    if a.vararg:
        named.append(("*" + a.vararg.arg, a.vararg))
    if a.kwarg:
        named.append(("**" + a.kwarg.arg, a.kwarg))
    return named


def args_section(docstring):
    """The parameter names an ``Args:`` section of a Google-style docstring lists, or None without one."""
    lines = (docstring or "").splitlines()
    for i, line in enumerate(lines):
        if line.strip() == "Args:":
            indent = len(line) - len(line.lstrip())
            names = []
            for item in lines[i + 1:]:
                if item.strip() and len(item) - len(item.lstrip()) <= indent:
                    break
                m = ARG_LINE.match(item)
                if m and len(item) - len(item.lstrip()) <= indent + 4:
                    names.append(m.group(1))
            return names
    return None


def test_every_public_package_has_a_page():
    rendered = {module for _, module, _ in page_blocks()}
    missing = [p for p in PUBLIC_PACKAGES if not any(m == p or m.startswith(p + ".") for m in rendered)]
    assert not missing, f"public packages without a docs/api page: {missing}"


def test_every_page_block_names_a_module_with_its_public_names():
    broken = []
    for page, module, members in page_blocks():
        if module_path(module) is None:
            broken.append(f"{page}: no module {module}")
        elif members is None and exported_names(module) is None:
            broken.append(f"{page}: {module} has no __all__ (and the block lists no members)")
    assert not broken, "; ".join(broken)


def test_every_rendered_name_is_defined_and_has_a_docstring():
    bad = [f"{where}.{name}" + (" (defined nowhere in basebn)" if node is None else "")
           for where, name, node, after in documented_names() if node is None or not _docstring(node, after)]
    assert not bad, "names rendered in docs/api without a docstring: " + ", ".join(bad)


def test_every_rendered_function_hints_and_documents_its_arguments():
    bad = []
    for where, name, node, _ in documented_names():
        fn, docstrings = _signature_of(node)
        if fn is None:
            continue
        params = parameters(fn)
        unhinted = [p for p, arg in params if arg.annotation is None]
        if unhinted:
            bad.append(f"{where}.{name}: no type hint on {', '.join(unhinted)}")
        if not params:
            continue
        listed = next((names for names in map(args_section, docstrings) if names is not None), None)
        if listed is None:
            bad.append(f"{where}.{name}: no Args: section")
            continue
        undocumented = [p for p, _ in params if p not in listed and p.lstrip("*") not in listed]
        if undocumented:
            bad.append(f"{where}.{name}: Args: does not name {', '.join(undocumented)}")
    assert not bad, "functions rendered in docs/api with undocumented arguments:\n" + "\n".join(bad)


@pytest.mark.parametrize("docstring, expected", [
    ("Do it.\n\nArgs:\n    x (int): the x.\n    y: the y,\n        on two lines.\n\nReturns:\n    z.", ["x", "y"]),
    ("Do it.\n\nArgs:\n    **kwargs: to the constructor.", ["**kwargs"]),
    ("Do it.\n\nReturns:\n    z.", None),
])
def test_args_section_reads_google_style(docstring, expected):
    assert args_section(docstring) == expected
