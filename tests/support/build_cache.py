"""Build outputs kept between test runs in the user cache, as ccache keeps objects: ``~/.cache/basebn/test-builds``.

:func:`cached_build` gives ``make(folder)``'s result for a key (:func:`build_key`): the sha256 of everything the
output depends on, namely the contents of the source files and of every local header they include
(:func:`local_includes`), each tool's resolved path and ``--version`` output, and the flags and other values the
caller names. A later run with the same key reads the result back instead of building; a change of any of them
builds into a new folder. Only a result that ``keep`` accepts (a build whose every step succeeded) is kept, so a
failure is built again next time. Processes that need one key at once (pytest-xdist workers, two runs) wait on an
flock for the first one's build. Delete the folder to build everything afresh.
"""
import functools
import hashlib
import os
import pickle
import re
import shutil
import subprocess

from basebn.utils.fs import file_lock

CACHE_DIR = os.path.join(os.path.expanduser("~"), ".cache", "basebn", "test-builds")
_RESULT = "result.pickle"
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


@functools.lru_cache(maxsize=None)
def tool_identity(path):
    """The resolved path of the program ``path`` (a name is looked up on PATH) and its ``--version`` output."""
    found = shutil.which(path)
    if found is None:
        return path, "not found"
    found = os.path.realpath(found)
    res = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=60)
    return found, res.stdout + res.stderr


def local_includes(sources):
    """``sources`` and every file they include with ``#include "..."`` that exists beside its includer, recursively."""
    seen, todo = [], [os.path.abspath(s) for s in sources]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.append(path)
        with open(path, encoding="utf-8", errors="replace") as f:
            for name in _INCLUDE.findall(f.read()):
                inc = os.path.join(os.path.dirname(path), name)
                if os.path.exists(inc):
                    todo.append(os.path.abspath(inc))
    return sorted(seen)


def build_key(files, tools, values):
    """The sha256 (hex) of ``files``' names and contents, ``tools``' identities (:func:`tool_identity`) and the repr of
    ``values``."""
    h = hashlib.sha256()
    for path in sorted(files):
        with open(path, "rb") as f:
            h.update(os.path.basename(path).encode() + b"\0" + hashlib.sha256(f.read()).digest())
    for tool in tools:
        h.update(repr(tool_identity(tool)).encode())
    h.update(repr(values).encode())
    return h.hexdigest()


def cached_build(name, key, make, keep=lambda result: True):
    """``make(folder)``'s result for ``key``, made once in ``CACHE_DIR/name/<key>`` (see the module docstring)."""
    parent = os.path.join(CACHE_DIR, name)
    os.makedirs(parent, exist_ok=True)
    folder = os.path.join(parent, key[:32])
    with file_lock(folder + ".lock"):
        result_file = os.path.join(folder, _RESULT)
        if os.path.exists(result_file):
            with open(result_file, "rb") as f:
                return pickle.load(f)
        shutil.rmtree(folder, ignore_errors=True)  # a build that did not finish, or was not kept
        os.makedirs(folder)
        result = make(folder)
        if keep(result):
            with open(result_file + ".tmp", "wb") as f:
                pickle.dump(result, f)
            os.replace(result_file + ".tmp", result_file)
        return result
