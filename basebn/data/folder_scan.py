"""The file list of one image-folder split: ``SPLIT/<class>/**/*.{jpg,jpeg,png,webp,bmp}``, cached.

Class folders are the split's sub-directories (sorted; hidden ones skipped); each is walked depth first
(a directory's files, then its sub-directories, both sorted), links followed, but no directory is entered
twice in a split (identified by device + inode): a link back up (``ln -s .. up``), to itself or into
another class folder is skipped and listed in ``FolderScan.skipped``, so loops end and nothing is counted
twice. Directories that cannot be listed are in ``FolderScan.unreadable``, never silently empty. A scan is
kept in memory per process and in ``$BASEBN_DATA_CACHE`` (default ~/.cache/basebn/imagefolder), one JSON
file per split directory, valid while no scanned directory's mtime has changed; scans with unreadable
directories are not cached.
"""

import hashlib
import json
import os
from typing import Dict, List, NamedTuple, Tuple

import numpy as np

from ..utils.fs import atomic_write_bytes

__all__ = ["FolderScan", "IMAGE_EXTENSIONS", "scan_split", "folder_cache_dir"]

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp")
_CACHE_VERSION = 2
_SCANNED: Dict[str, dict] = {}  # in-process: split dir -> scan (checked against the mtimes like the disk cache)


class FolderScan(NamedTuple):
    """One split: class folder names, image paths, labels (positions in ``classes``), per-folder notes."""
    classes: List[str]
    paths: List[str]
    labels: np.ndarray          # int32, index into ``classes``
    skipped: List[str]          # "LINK -> TARGET": directory links not followed (already scanned)
    unreadable: List[str]       # "DIR: reason": directories that could not be listed


def folder_cache_dir() -> str:
    """Where file lists are cached: ``$BASEBN_DATA_CACHE``, else ~/.cache/basebn/imagefolder."""
    return os.environ.get("BASEBN_DATA_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "basebn", "imagefolder")


def _dir_id(path: str) -> Tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _walk(class_dir: str, visited: Dict[Tuple[int, int], str], mtimes: Dict[str, int],
          skipped: List[str], unreadable: List[str]) -> List[str]:
    """Image paths under ``class_dir`` (depth first, sorted), entering no directory of ``visited`` again."""
    files: List[str] = []
    stack = [class_dir]
    while stack:
        directory = stack.pop()
        try:
            mtimes[directory] = os.stat(directory).st_mtime_ns
            with os.scandir(directory) as it:
                entries = sorted((e for e in it if not e.name.startswith(".")), key=lambda e: e.name)
        except OSError as e:
            unreadable.append(f"{directory}: {e.strerror or e}")
            continue
        subdirs = []
        for entry in entries:
            if entry.is_dir():  # follows links
                try:
                    key = _dir_id(entry.path)
                except OSError as e:
                    unreadable.append(f"{entry.path}: {e.strerror or e}")
                    continue
                if key in visited:
                    skipped.append(f"{entry.path} -> {visited[key]}")
                    continue
                visited[key] = entry.path
                subdirs.append(entry.path)
            elif entry.name.lower().endswith(IMAGE_EXTENSIONS):  # also dangling links: reported when decoded
                files.append(entry.path)
        stack.extend(reversed(subdirs))
    return files


def _still_valid(mtimes: Dict[str, int]) -> bool:
    try:
        return all(os.stat(d).st_mtime_ns == t for d, t in mtimes.items())
    except OSError:
        return False


def _as_scan(cached: dict) -> FolderScan:
    return FolderScan(cached["classes"], cached["paths"], np.asarray(cached["labels"], np.int32),
                      cached["skipped"], [])


def scan_split(split_dir: str) -> FolderScan:
    """The :class:`FolderScan` of ``split_dir``, from a cache when still valid."""
    split_dir = os.path.abspath(split_dir)
    key = hashlib.sha1(split_dir.encode()).hexdigest()[:20]
    cache_file = os.path.join(folder_cache_dir(), f"{key}.json")
    for cached in _cached_scans(split_dir, cache_file):
        if cached.get("version") == _CACHE_VERSION and _still_valid(cached["mtimes"]):
            return _as_scan(cached)
    mtimes = {split_dir: os.stat(split_dir).st_mtime_ns}
    with os.scandir(split_dir) as it:
        classes = sorted(e.name for e in it if e.is_dir() and not e.name.startswith("."))
    class_dirs = [os.path.join(split_dir, c) for c in classes]
    # every class folder is its own class: a link into one from another is skipped, not walked twice
    visited = {_dir_id(split_dir): split_dir}
    for d in class_dirs:
        visited.setdefault(_dir_id(d), d)
    paths: List[str] = []
    labels: List[int] = []
    skipped: List[str] = []
    unreadable: List[str] = []
    for label, d in enumerate(class_dirs):
        if visited[_dir_id(d)] != d:  # the same directory as an earlier class folder
            skipped.append(f"{d} -> {visited[_dir_id(d)]}")
            continue
        files = _walk(d, visited, mtimes, skipped, unreadable)
        paths += files
        labels += [label] * len(files)
    scan = dict(version=_CACHE_VERSION, classes=classes, paths=paths, labels=labels, mtimes=mtimes,
                skipped=skipped)
    if unreadable:  # what they hold is unknown, and fixing permissions changes no mtime: never cached
        return FolderScan(classes, paths, np.asarray(labels, np.int32), skipped, unreadable)
    _SCANNED[split_dir] = scan
    try:
        os.makedirs(os.path.dirname(cache_file), exist_ok=True)
        atomic_write_bytes(cache_file, json.dumps(scan).encode())
    except OSError:  # an unwritable cache only costs a re-scan next time
        pass
    return _as_scan(scan)


def _cached_scans(split_dir: str, cache_file: str):
    if split_dir in _SCANNED:
        yield _SCANNED[split_dir]
    try:
        with open(cache_file) as f:
            cached = json.load(f)
    except (OSError, ValueError):
        return
    if isinstance(cached, dict) and "mtimes" in cached:
        _SCANNED[split_dir] = cached
        yield cached
