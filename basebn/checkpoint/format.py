"""The .npz container of checkpoints and zoo weights: named arrays + JSON metadata + a sha256 checksum.

Read with allow_pickle=False, so a file can hold data only, never code. `__meta__` is the metadata (UTF-8
JSON as uint8); `__sha256__` is the hex sha256 of the canonical content: for every other entry, sorted by
name, its name, dtype, shape and bytes. A file without `__sha256__` (the shipped zoo weights) is read as
unchecked; the zoo verifies those by the file's sha256 in zoo.json instead.

Sizes are checked before anything is read: the members together may not decompress to more than this machine's
memory (check_member_sizes), and no .npy member may declare an array larger than the member itself (a small
member declaring a huge shape would make numpy allocate that much before it finds the data missing). A reader
that knows the model the file is for passes `fits` (model_state.member_fit): every member's declared shape and
dtype are checked against the model from the .npy headers, so a file that cannot fit is refused unread.
"""
import hashlib
import io
import json
import math
import os
import struct
import zipfile
import zlib

import numpy as np

from ..utils.fs import atomic_write_bytes
from ..utils.interrupts import deferred
from .errors import CheckpointError

__all__ = ["META", "CHECKSUM", "ZIP_MAGIC", "write_container", "read_container", "content_sha256", "sniff",
           "memory_budget_bytes", "declared_nbytes", "check_member_sizes", "read_meta"]

META, CHECKSUM = "__meta__", "__sha256__"
ZIP_MAGIC = b"PK\x03\x04"
_PICKLE_MAGIC = b"\x80"  # protocol 2 and later
# what a damaged zip or .npy member raises inside np.load
_READ_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, OSError, KeyError, ValueError, struct.error,
                NotImplementedError, TypeError)


def content_sha256(entries):
    """Hex sha256 over (name, dtype, shape, bytes) of every entry, sorted by name."""
    h = hashlib.sha256()
    for name in sorted(entries):
        a = np.asarray(entries[name])
        header = json.dumps([name, a.dtype.str, list(a.shape), a.nbytes]).encode()
        h.update(len(header).to_bytes(8, "little") + header)
        h.update(a.tobytes())
    return h.hexdigest()


def write_container(path, arrays, meta):
    """Atomically write `arrays` ({name: ndarray}) and the JSON-able dict `meta`, with the checksum."""
    entries = {}
    for name, value in arrays.items():
        if name in (META, CHECKSUM):
            raise CheckpointError(f"array name {name!r} is reserved")
        a = np.asarray(value)
        if a.dtype == object:
            raise CheckpointError(f"{name}: object arrays cannot be stored (they would need pickle)")
        entries[name] = a
    entries[META] = np.frombuffer(json.dumps(meta, sort_keys=True).encode(), dtype=np.uint8)
    entries[CHECKSUM] = np.frombuffer(content_sha256(entries).encode("ascii"), dtype=np.uint8)
    with deferred():  # a Ctrl-C / SIGTERM ends the run after the write, not inside np.savez
        buf = io.BytesIO()
        np.savez(buf, **entries)
        atomic_write_bytes(path, buf.getvalue())


def sniff(path):
    """'npz', 'pickle' or None, from the file's first bytes."""
    with open(path, "rb") as f:
        head = f.read(4)
    if head == ZIP_MAGIC:
        return "npz"
    return "pickle" if head[:1] == _PICKLE_MAGIC else None


def memory_budget_bytes():
    """The most a weights file may decompress to: this machine's physical memory (64 GiB when unknown)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 64 << 30


_HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


def _member_header(zf, info):
    """(shape, dtype) a .npy member's header declares; only the header is read, never the data."""
    with zf.open(info) as f:
        version = np.lib.format.read_magic(f)
        reader = _HEADER_READERS.get(version)
        if reader is None:
            raise ValueError(f"unsupported .npy format version {version}")
        shape, _, dtype = reader(f)
    return tuple(int(d) for d in shape), dtype


def declared_nbytes(shape, dtype):
    """Bytes of an array of `shape` and `dtype` (its shape times its item size); 0 for an object array, which
    np.load(allow_pickle=False) refuses without allocating it."""
    return 0 if dtype.hasobject else math.prod(shape) * dtype.itemsize


_MAX_LISTED = 5  # misfits a refusal names


def check_member_sizes(path, fits=None):
    """CheckpointError, before any array is read, when the .npz at `path` would need more memory than its
    declared sizes allow: members decompressing to more than memory_budget_bytes() together, or an .npy member
    declaring an array larger than the member holds. With `fits` (a callable (entry name, shape, dtype) ->
    the misfit in words, or None), also when a member's declared shape or dtype does not fit the model."""
    try:
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
            total, budget = sum(i.file_size for i in infos), memory_budget_bytes()
            if total > budget:
                raise CheckpointError(f"{path!r} would decompress to {total / 2**30:.3g} GiB, more than this "
                                      f"machine's memory ({budget / 2**30:.3g} GiB): refused, nothing was read "
                                      f"(a damaged or hostile file?)")
            misfits = []
            for info in infos:
                if info.filename.endswith(".npy"):
                    shape, dtype = _member_header(zf, info)
                    declared = declared_nbytes(shape, dtype)
                    if declared > info.file_size:
                        raise CheckpointError(
                            f"checkpoint {path!r}: member {info.filename} declares an array of {declared} bytes but "
                            f"holds {info.file_size}: the file is corrupt or hostile, it was not loaded")
                    misfit = fits(info.filename[:-len(".npy")], shape, dtype) if fits is not None else None
                    if misfit:
                        misfits.append(misfit)
    except CheckpointError:
        raise
    except _READ_ERRORS as exc:
        raise _corrupt(path, exc) from exc
    if misfits:
        more = f" (and {len(misfits) - _MAX_LISTED} more)" if len(misfits) > _MAX_LISTED else ""
        raise CheckpointError(f"{path!r} does not fit this model (different architecture, num_classes or norm?): "
                              f"{'; '.join(misfits[:_MAX_LISTED])}{more}; refused from the .npy headers, no array "
                              f"was read")


def _check_npz(path):
    """CheckpointError unless `path` is a file that starts as a zip archive."""
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint {path!r} does not exist")
    kind = sniff(path)
    if kind != "npz":
        what = "a pickle" if kind == "pickle" else "not a zip archive"
        raise CheckpointError(f"{path!r} is not an .npz checkpoint or weights file ({what}); it was not loaded")


def read_meta(path):
    """The JSON metadata of the .npz at `path` from its `__meta__` entry alone: no array is read, so the checksum
    (over every array) is not verified; read_container verifies it. {} for a file without metadata."""
    _check_npz(path)
    check_member_sizes(path)
    try:
        with zipfile.ZipFile(path) as zf:
            if META + ".npy" not in zf.namelist():
                return {}
            with zf.open(META + ".npy") as f:
                raw = np.lib.format.read_array(f, allow_pickle=False)
    except _READ_ERRORS as exc:
        raise _corrupt(path, exc) from exc
    return _parse_meta(path, raw)


def read_container(path, fits=None):
    """-> (arrays, meta, checked): checked is False for a file without a checksum entry. Never unpickles.
    `fits`: see check_member_sizes (a file that cannot fit the model is refused before any array is read)."""
    _check_npz(path)
    check_member_sizes(path, fits)
    try:
        with np.load(path, allow_pickle=False) as z:
            entries = {name: z[name] for name in z.files}
    except ValueError as exc:
        if "allow_pickle" in str(exc):
            raise CheckpointError(f"{path!r} holds an object array (pickled Python objects); refused: checkpoint "
                                  f"and weights files may hold plain numeric arrays only") from exc
        raise _corrupt(path, exc) from exc
    except _READ_ERRORS as exc:
        raise _corrupt(path, exc) from exc
    stored = entries.pop(CHECKSUM, None)
    if stored is not None:
        want, got = _text(stored), content_sha256(entries)
        if want != got:
            raise CheckpointError(f"{path!r} fails its checksum (stored {want[:16]}..., content {got[:16]}...): "
                                  f"the file is damaged (e.g. a flipped bit); use another checkpoint")
    return entries, _parse_meta(path, entries.pop(META, None)), stored is not None


def _parse_meta(path, raw):
    """The JSON object the `__meta__` entry `raw` holds ({} for None)."""
    try:
        meta = json.loads(_text(raw)) if raw is not None else {}
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise _corrupt(path, exc) from exc
    if not isinstance(meta, dict):
        raise _corrupt(path, TypeError("metadata is not a JSON object"))
    return meta


def _text(a):
    """The UTF-8 text a uint8 entry holds ('' for an entry of another kind, which then fails the checks)."""
    if a.dtype != np.uint8 or a.ndim != 1:
        return ""
    return a.tobytes().decode("utf-8", errors="replace")


def _corrupt(path, exc):
    return CheckpointError(f"checkpoint {path!r} is truncated or corrupt ({type(exc).__name__}: {exc}); "
                           f"use another file")
