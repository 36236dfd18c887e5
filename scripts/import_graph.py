"""Print basebn's import graph from the source (nothing is imported): package arrows, module cycles,
imports inside functions, and the largest modules; with --within PKG also the arrows between PKG's modules.

    python scripts/import_graph.py [--root basebn] [--within basebn.layers]
"""
import argparse
import ast
import os
import sys
from collections import defaultdict

# optional dependencies may be imported inside functions; everything else is imported at module top
OPTIONAL = {"mpi4py", "matplotlib", "tqdm", "torch", "torchvision", "timm", "onnx", "onnxruntime", "safetensors",
            "megenginelite"}


def module_name(path, root):
    rel = os.path.relpath(path, os.path.dirname(root))[:-3].replace(os.sep, ".")
    return rel[:-len(".__init__")] if rel.endswith(".__init__") else rel


def _resolve(node, current, is_package):
    """Absolute module names an ImportFrom/Import node refers to."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level == 0:
        base = node.module
    else:
        parts = current.split(".")
        keep = len(parts) - node.level + (1 if is_package else 0)
        base = ".".join(parts[:keep] + ([node.module] if node.module else []))
    # `from . import x` may name a submodule: record both the package and base.x
    return [base] + [f"{base}.{a.name}" for a in node.names]


def scan(root):
    """{module: {"imports": set, "lazy": [(line, name)], "lines": n}} for every .py under root."""
    modules = {}
    for folder, _, files in os.walk(root):
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            mod = module_name(path, root)
            source = open(path).read()
            tree = ast.parse(source)
            info = {"imports": set(), "lazy": [], "lines": source.count("\n"), "path": path}
            top_level = set(map(id, tree.body))
            for node in ast.walk(tree):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    names = _resolve(node, mod, name == "__init__.py")
                    info["imports"].update(names)
                    if id(node) not in top_level and not _guarded_top(node, tree):
                        info["lazy"].extend((node.lineno, n) for n in names[:1])
            modules[mod] = info
    internal = set(modules)
    for info in modules.values():
        info["imports"] = {n for n in info["imports"] if n in internal}
    return modules


def _guarded_top(node, tree):
    """An import at module level inside if/try (e.g. TYPE_CHECKING) is not lazy."""
    for stmt in tree.body:
        if isinstance(stmt, (ast.If, ast.Try)) and any(n is node for n in ast.walk(stmt)):
            return True
    return False


def lazy_imports(modules):
    """[(module, line, imported)] imports inside functions of anything but optional dependencies."""
    return [(m, line, name) for m, info in sorted(modules.items()) for line, name in info["lazy"]
            if name.split(".")[0] not in OPTIONAL]


def package_of(mod):
    parts = mod.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else mod


def package_arrows(modules):
    arrows = defaultdict(set)
    for mod, info in modules.items():
        for dep in info["imports"]:
            a, b = package_of(mod), package_of(dep)
            if a != b and dep != "basebn":
                arrows[a].add(b)
    return arrows


def module_arrows(modules, package):
    """{module: sorted modules it imports} for the modules of ``package`` (subpackages as one node each)."""
    depth = package.count(".") + 2

    def node(mod):
        return ".".join(mod.split(".")[:depth])

    arrows = defaultdict(set)
    for mod, info in modules.items():
        if not mod.startswith(package + "."):
            continue
        for dep in info["imports"]:
            if dep.startswith(package + ".") and node(dep) != node(mod):
                arrows[node(mod)].add(node(dep))
    return {m: sorted(deps) for m, deps in sorted(arrows.items())}


def cycles(graph):
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--root", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "basebn"))
    p.add_argument("--largest", type=int, default=8)
    p.add_argument("--within", action="append", default=[], metavar="PKG",
                   help="also print the arrows between the modules of PKG (e.g. basebn.layers); repeatable")
    args = p.parse_args(argv)
    modules = scan(args.root)
    print("package arrows:")
    for a, bs in sorted(package_arrows(modules).items()):
        print(f"  {a} -> {', '.join(sorted(bs))}")
    mod_graph = {m: {d for d in info["imports"] if d != m and not m.startswith(d + ".")} for m, info in modules.items()}
    print("module cycles:", cycles(mod_graph) or "none")
    print("package cycles:", cycles(package_arrows(modules)) or "none")
    lazy = lazy_imports(modules)
    print(f"imports inside functions (not optional dependencies): {len(lazy)}")
    for m, line, name in lazy:
        print(f"  {m}:{line} {name}")
    for package in args.within:
        print(f"module arrows within {package}:")
        for a, bs in module_arrows(modules, package).items():
            print(f"  {a[len(package) + 1:]} -> {', '.join(b[len(package) + 1:] for b in bs)}")
    print(f"{len(modules)} modules; largest:")
    for m, info in sorted(modules.items(), key=lambda kv: -kv[1]["lines"])[:args.largest]:
        print(f"  {info['lines']:5d} {m}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
