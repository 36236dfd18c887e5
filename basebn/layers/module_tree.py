"""Find and replace modules in a model by dotted path (``layer1.0.bn1``; list items and dict values by key)."""
import megengine.module as M

__all__ = ["get_module", "find_module", "set_module", "parent_and_key", "replace_modules"]

_NOT_FOUND = (AttributeError, IndexError, KeyError, ValueError)


def get_module(model, path):
    """The object at dotted path ``path`` of ``model`` (``''`` is the model itself)."""
    obj = model
    if not path:
        return obj
    for part in path.split("."):
        if isinstance(obj, (list, tuple)):
            obj = obj[int(part)]
        elif isinstance(obj, dict):
            obj = obj[part]
        else:
            obj = getattr(obj, part)
    return obj


def find_module(model, path):
    """Like :func:`get_module`, but None when ``path`` does not resolve."""
    try:
        return get_module(model, path)
    except _NOT_FOUND:
        return None


def parent_and_key(model, path):
    """``(container, key)`` holding the module at ``path``: a Module, list or dict, and the last path part."""
    parent_path, _, key = path.rpartition(".")
    return get_module(model, parent_path), key


def set_module(model, path, new):
    """Replace the module at ``path`` of ``model`` by ``new`` (attribute, list item or dict value)."""
    parent, key = parent_and_key(model, path)
    if isinstance(parent, list):
        parent[int(key)] = new
    elif isinstance(parent, dict):
        parent[key] = new
    elif isinstance(parent, tuple):
        raise TypeError(f"cannot replace {path!r}: it lives in a tuple")
    else:
        setattr(parent, key, new)


def replace_modules(module, convert):
    """Replace, in place, every module ``m`` of the tree for which ``convert(m)`` returns a replacement.

    ``convert(m)`` returns the new module, or None to leave ``m`` and look into its children
    (attributes, and lists / tuples / dicts of them, nested). A module shared by several places
    is converted once. Returns ``module``, or its replacement when ``convert(module)`` gives one.
    """
    done = {}  # id(old) -> new (or old when kept)

    def visit(m):
        if id(m) in done:
            return done[id(m)]
        new = convert(m)
        done[id(m)] = m if new is None else new
        if new is not None:
            return new
        for key, value in list(vars(m).items()):
            replaced = walk(value)
            if replaced is not value:
                setattr(m, key, replaced)
        return m

    def walk(value):
        if isinstance(value, M.Module):
            return visit(value)
        if isinstance(value, list):  # lists and dicts are updated in place
            for i, item in enumerate(value):
                new = walk(item)
                if new is not item:
                    value[i] = new
            return value
        if isinstance(value, dict):
            for k, item in list(value.items()):
                new = walk(item)
                if new is not item:
                    value[k] = new
            return value
        if isinstance(value, tuple):
            items = [walk(v) for v in value]
            if all(a is b for a, b in zip(items, value)):
                return value
            return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
        return value

    return visit(module)
