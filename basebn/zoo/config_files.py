"""Which config files a zoo entry's config runs, and the check that each is the one zoo.json recorded.

An entry's config is Python, so it runs only when it and every config it derives from lie inside the entry's
config root and have the sha256 recorded in the entry's ``config_sha256`` ({path relative to the root:
sha256}). The configs it derives from are the ones it names as ``config_class("NAME.py", relative_to=__file__)``,
found by reading the (already verified) file, never by running it. Each file is hash-checked before it is read.
"""
import ast
import os

from ..utils.fs import sha256_of
from .errors import ZooError

__all__ = ["is_inside", "relative_key", "config_closure", "config_hashes", "verify_config_files"]


def is_inside(path, root):
    """True when `path` (symlinks resolved) is `root` or lies below it."""
    path, root = os.path.realpath(path), os.path.realpath(root)
    return os.path.commonpath([path, root]) == root


def relative_key(path, root):
    """`path` relative to `root` with '/' separators (symlinks resolved): the key of config_sha256."""
    return os.path.relpath(os.path.realpath(path), os.path.realpath(root)).replace(os.sep, "/")


def _bases(path, what):
    """Paths of the configs `path` derives from: its config_class("NAME.py", relative_to=__file__) calls."""
    with open(path, "rb") as f:
        source = f.read()
    try:
        tree = ast.parse(source, filename=path)
    except (SyntaxError, ValueError) as exc:
        raise ZooError(f"{what}: config {path} does not parse ({exc})") from exc
    bases = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if (func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)) != "config_class":
            continue
        relative_to = [k.value for k in node.keywords if k.arg == "relative_to"]
        literal = node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
        if not literal or len(relative_to) != 1 or not (isinstance(relative_to[0], ast.Name)
                                                         and relative_to[0].id == "__file__"):
            raise ZooError(f"{what}: config {path} line {node.lineno} names a base config that cannot be verified; "
                           f'a zoo config derives from others only as config_class("NAME.py", relative_to=__file__)')
        bases.append(os.path.join(os.path.dirname(path), node.args[0].value))
    return bases


def _walk(config_path, root, what, check):
    """Visit the config and the configs it derives from (each once), calling check(path, key) before reading it."""
    seen, todo, order = set(), [config_path], []
    while todo:
        path = todo.pop()
        key = relative_key(path, root)
        if key in seen:
            continue
        if not is_inside(path, root):
            raise ZooError(f"{what}: config {path} lies outside {root}; a zoo entry's configs must be inside the "
                           f"zoo folder (or the shipped configs); nothing was run")
        if not os.path.isfile(path):
            raise ZooError(f"{what}: config {path} not found (a config path is relative to {root})")
        check(path, key)
        seen.add(key)
        order.append(key)
        todo.extend(reversed(_bases(path, what)))
    return order


def config_closure(config_path, root, what="config"):
    """Keys (relative to `root`) of `config_path` and of every config it derives from, the config first."""
    return _walk(config_path, root, what, lambda path, key: None)


def config_hashes(config_path, root, what="config"):
    """{key: sha256} of `config_path` and the configs it derives from: an entry's config_sha256."""
    return {key: sha256_of(os.path.join(root, key)) for key in config_closure(config_path, root, what)}


def verify_config_files(config_path, root, recorded, what):
    """ZooError unless `config_path` and every config it derives from are inside `root` and have the sha256 that
    `recorded` ({key: sha256}, an entry's config_sha256) holds for them. Runs nothing."""
    if not isinstance(recorded, dict) or not recorded:
        raise ZooError(f"{what} records no config_sha256 for its config, so it is not run (a config is code); "
                       f"having reviewed the config, record it with python -m basebn.tools.zoo_rehash")

    def check(path, key):
        want = recorded.get(key)
        if not isinstance(want, str):
            raise ZooError(f"{what}: config {key} (used by the entry's config) has no sha256 in its config_sha256, "
                           f"so it is not run; record it with python -m basebn.tools.zoo_rehash")
        got = sha256_of(path)
        if got != want:
            raise ZooError(f"{what}: config {path} has sha256 {got[:16]}..., zoo.json records {want[:16]}...: it "
                           f"was changed after the entry was recorded, so it is not run; restore it (or, having "
                           f"reviewed the change, record it: python -m basebn.tools.zoo_rehash)")

    _walk(config_path, root, what, check)
