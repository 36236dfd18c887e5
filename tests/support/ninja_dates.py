"""Redate a ninja build directory (a copy of the kernel cache's), so that ninja sees its objects as just built.

ninja rebuilds an output older than its newest input, and trusts an object's recorded header dependencies only while
the object is no newer than the time ``.ninja_deps`` recorded with them; ``.ninja_log`` records each output's time too.
A copy of a build made from an earlier checkout (older objects, the same source contents) would be compiled again;
:func:`redate_build` sets all three, the files' and the two logs', to one time. Reads and writes ``.ninja_deps``
format 4 (ninja 1.10 to 1.13) in native byte order, as ninja does.
"""
import os
import struct
import time

_DEPS_SIGNATURE = b"# ninjadeps\n"
_DEPS_VERSION = 4
_DEPS_FLAG = 0x80000000  # a record's size word: set for a deps record, clear for a path record


def _deps_records(data):
    """``(offset, size, is_deps)`` of each record of a ``.ninja_deps`` file's bytes."""
    pos = len(_DEPS_SIGNATURE)
    if data[:pos] != _DEPS_SIGNATURE or struct.unpack_from("=i", data, pos)[0] != _DEPS_VERSION:
        raise ValueError(f"not a version-{_DEPS_VERSION} .ninja_deps file")
    pos, records = pos + 4, []
    while pos + 4 <= len(data):
        (word,) = struct.unpack_from("=I", data, pos)
        size = word & (_DEPS_FLAG - 1)
        records.append((pos + 4, size, bool(word & _DEPS_FLAG)))
        pos += 4 + size
    return records


def _recorded_paths(build_dir):
    """The paths ``.ninja_deps`` names (the objects, and the sources and headers they were compiled from), absolute."""
    with open(os.path.join(build_dir, ".ninja_deps"), "rb") as f:
        data = f.read()
    paths = [data[at:at + size - 4].rstrip(b"\0").decode() for at, size, is_deps in _deps_records(data) if not is_deps]
    return [os.path.join(build_dir, p) for p in paths]


def redate_build(build_dir, ns=None):
    """Date every output ``.ninja_log`` names in ``build_dir`` (the files, and the times both logs recorded) ``ns``
    nanoseconds after the epoch; by default now, or just after the newest input the deps log names if that is later:
    ninja then only relinks a library that is missing. Returns the time set."""
    log_path, deps_path = os.path.join(build_dir, ".ninja_log"), os.path.join(build_dir, ".ninja_deps")
    if ns is None:
        inputs = [p for p in _recorded_paths(build_dir) if os.path.exists(p)]
        ns = max([time.time_ns()] + [os.stat(p).st_mtime_ns + 1 for p in inputs])
    with open(log_path) as f:
        lines = f.read().splitlines()
    outputs = set()
    for i, line in enumerate(lines):
        fields = line.split("\t")
        if not line.startswith("#") and len(fields) == 5:  # start, end, mtime, output, command hash
            fields[2] = str(ns)
            outputs.add(fields[3])
            lines[i] = "\t".join(fields)
    with open(log_path, "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(deps_path, "rb") as f:
        data = bytearray(f.read())
    for at, _, is_deps in _deps_records(data):
        if is_deps:  # output id, then the time as two 32-bit words, low first, then the input ids
            struct.pack_into("=II", data, at + 4, ns & 0xFFFFFFFF, ns >> 32)
    with open(deps_path, "wb") as f:
        f.write(data)
    for name in outputs:
        path = os.path.join(build_dir, name)
        if os.path.exists(path):
            os.utime(path, ns=(ns, ns))
    return ns
