"""Download a URL into a cache: one process per file, a partial file resumed, nothing kept that is incomplete.

The bytes go to ``NAME.part`` beside ``NAME`` while this process holds an flock on ``NAME.lock``
(:func:`basebn.utils.fs.file_lock`): a second process downloading the same file says once that it waits, then
uses the finished file. The ``.part`` becomes ``NAME`` (fsync, rename) only when it is whole: as long as the
server's Content-Length said, its sha256 the one given (zoo entries), accepted by the caller's `check` (basecls:
a pickle of arrays). A transfer cut short keeps its ``.part``, resumed by the next run (HTTP Range); a ``.part``
the server will not resume (416), or larger than the file, is discarded with one line and the download starts
over; a file that is refused is removed. No download exceeds MAX_DOWNLOAD_BYTES. Progress: a tqdm bar on a
terminal, else a log line every PROGRESS_INTERVAL_S seconds.
"""
import contextlib
import http.client
import os
import re
import sys
import time
import urllib.error
import urllib.request

from loguru import logger

from ..utils.fs import durable_replace, file_lock, sha256_of
from .errors import DownloadError, ZooError

__all__ = ["CACHE_ENV", "MAX_DOWNLOAD_BYTES", "PROGRESS_INTERVAL_S", "download", "cache_dir", "make_cache_dir",
           "describe_content"]

CACHE_ENV = "BASEBN_CACHE"
MAX_DOWNLOAD_BYTES = 2 << 30  # the largest published weights are a few hundred MB; a server that never ends is cut
PROGRESS_INTERVAL_S = 5.0  # seconds between progress lines when stderr is not a terminal
_BLOCK = 1 << 16
_RANGE = re.compile(r"bytes\s+(\d+|\*)(?:-\d+)?/(\d+|\*)")


def cache_dir():
    """Where downloaded zoo weights go: $BASEBN_CACHE, else ~/.cache/basebn/zoo."""
    return os.environ.get(CACHE_ENV, os.path.join(os.path.expanduser("~"), ".cache", "basebn", "zoo"))


def make_cache_dir(folder):
    """Create the cache folder `folder` (and its parents); DownloadError, one line naming $BASEBN_CACHE, when a
    file is in the way or it cannot be created."""
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise DownloadError(_cache_problem(folder, exc)) from None


def describe_content(path):
    """What a downloaded file is, in a few words, for an error message (e.g. "an HTML page (1,234 bytes)")."""
    with open(path, "rb") as f:
        head = f.read(1024)
    size = os.path.getsize(path)
    text = head.lstrip().lower()
    if not head:
        return "an empty file"
    if text.startswith((b"<!doctype html", b"<html")) or b"<html" in text or b"<body" in text:
        return f"an HTML page ({size:,} bytes)"
    if text.startswith(b"<"):
        return f"an XML or HTML document ({size:,} bytes)"
    return f"{size:,} bytes beginning {head[:8]!r}"


def download(url, sha256, dest_dir=None, timeout=60, check=None, max_bytes=None):
    """Return the path of url's file in the cache, downloading (or finishing a partial download) if needed.

    `sha256` None (a source that publishes no hash): the file is cached under the URL's own name and an existing
    one is returned as it is. `check(path)` (optional) raises a ZooError when the complete download is not what it
    should be; the file is then removed and the error raised. `timeout` bounds connecting and each read;
    `max_bytes` (default MAX_DOWNLOAD_BYTES) the size. Raises DownloadError, one line, when nothing usable arrived.
    """
    dest_dir = dest_dir or cache_dir()
    make_cache_dir(dest_dir)
    name = os.path.basename(url.split("?")[0])
    dest = os.path.join(dest_dir, f"{sha256[:16]}-{name}" if sha256 else name)
    if _is_cached(dest, sha256):
        return dest
    limit = MAX_DOWNLOAD_BYTES if max_bytes is None else max_bytes
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(file_lock(dest + ".lock", on_wait=lambda: logger.info(
                f"waiting for another process downloading {name} into {dest_dir}")))
        except OSError as exc:
            raise DownloadError(_cache_problem(dest_dir, exc)) from None
        if _is_cached(dest, sha256):  # the other process finished it
            return dest
        part = dest + ".part"
        _fetch(url, part, timeout, limit)
        _accept(url, part, sha256, check)
        durable_replace(part, dest)
    return dest


def _is_cached(dest, sha256):
    return os.path.isfile(dest) and (sha256 is None or sha256_of(dest) == sha256)


def _fetch(url, part, timeout, limit):
    """Make `part` the whole file at `url`, continuing the bytes it holds when the server allows."""
    resp, have = _request(url, part, _size(part), timeout)
    if resp is None:
        return
    with resp:
        length = _int_or_none(resp.headers.get("Content-Length"))
        total = have + length if length is not None else None
        if total is not None and total > limit:
            raise DownloadError(f"{url} announces {total:,} bytes, more than the download limit of {limit:,} bytes; "
                                f"nothing was downloaded")
        progress = _Progress(url, have, total)
        done, cut = have, False
        try:
            with open(part, "ab" if have else "wb") as f:
                while True:
                    try:
                        block = resp.read(_BLOCK)
                    except (OSError, http.client.HTTPException) as exc:
                        f.close()
                        raise _network_error(url, exc, part) from exc
                    if not block:
                        break
                    if done + len(block) > limit:
                        cut = True
                        break
                    f.write(block)
                    done += len(block)
                    progress.update(len(block))
        finally:
            progress.close(complete=not cut and (total is None or done == total))
    if cut:
        os.remove(part)
        raise DownloadError(f"{url} sent more than the download limit of {limit:,} bytes without ending (and "
                            f"announced no length): cut off, nothing was cached", network=True)
    if total is not None and done < total:
        raise DownloadError(f"download of {url} ended after {done:,} of the {total:,} bytes the server announced; "
                            f"the partial file {part} is kept: run again to resume", network=True)


def _request(url, part, have, timeout):
    """-> (response, bytes of `part` it continues), or (None, size) when `part` is already whole."""
    req = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    try:
        resp = urllib.request.urlopen(req, timeout=timeout)
    except urllib.error.HTTPError as exc:
        total = _range_total(exc.headers.get("Content-Range")) if exc.code == 416 else None
        exc.close()
        if exc.code != 416 or not have:
            raise _network_error(url, exc, part) from exc
        if total == have:
            return None, have  # a whole file whose rename was cut short: checked like any download
        whole = f", the file has {total:,}" if total is not None else ""
        _discard(part, f"the server will not resume from it (HTTP 416{whole})")
        return _request(url, part, 0, timeout)
    except (OSError, http.client.HTTPException) as exc:
        raise _network_error(url, exc, part) from exc
    if not have:
        return resp, 0
    if resp.status == 206:
        start = _range_start(resp.headers.get("Content-Range"))
        if start is None or start == have:
            return resp, have
        resp.close()
        _discard(part, f"the server resumed at byte {start:,}, not at its end")
        return _request(url, part, 0, timeout)
    length = _int_or_none(resp.headers.get("Content-Length"))
    if length is not None and have > length:
        logger.warning(f"{part} ({have:,} bytes) is larger than the whole file ({length:,} bytes): discarded, "
                       f"downloading from the start")
    else:
        logger.info(f"{url}: the server does not resume downloads, downloading from the start")
    return resp, 0  # opened with "wb": the old bytes go


def _accept(url, part, sha256, check):
    """Remove `part` and raise unless it is the file wanted: its sha256 (when known) and the caller's check."""
    if sha256 is not None:
        got = sha256_of(part)
        if got != sha256:
            what = describe_content(part)
            os.remove(part)
            raise DownloadError(f"{url}: sha256 {got} does not match the recorded {sha256} (what arrived: {what}); "
                                f"it was removed, nothing was cached: run again to re-download")
    if check is not None:
        try:
            check(part)
        except ZooError:
            os.remove(part)
            raise


def _discard(part, why):
    logger.warning(f"{part} ({_size(part):,} bytes): {why}; discarded, downloading from the start")
    os.remove(part)


def _network_error(url, exc, part):
    reason = exc.reason if isinstance(exc, urllib.error.URLError) and not isinstance(exc, urllib.error.HTTPError) \
        else exc
    have = _size(part)
    kept = f"; the partial file {part} ({have:,} bytes) is kept: run again to resume" if have else ""
    return DownloadError(f"cannot download {url} ({reason}){kept}", network=True)


def _cache_problem(folder, exc):
    """One line for a cache folder that cannot be used: which, why, what to do."""
    blocker = _file_in_the_way(folder)
    why = f"{blocker} is a file, not a folder" if blocker else (exc.strerror or str(exc))
    env = os.environ.get(CACHE_ENV)
    where = f"{CACHE_ENV}={env}: " if env else ""
    fix = f"point {CACHE_ENV} at a folder you can write (or unset it)" if env else \
        f"set {CACHE_ENV} to a folder you can write"
    return f"{where}cannot use {folder} as the download cache ({why}); {fix}"


def _file_in_the_way(folder):
    """The nearest existing path at or above `folder` when it is not a folder, else None."""
    path = os.path.abspath(folder)
    while not os.path.lexists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path if os.path.lexists(path) and not os.path.isdir(path) else None


def _size(path):
    return os.path.getsize(path) if os.path.isfile(path) else 0


def _int_or_none(text):
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _range_start(content_range):
    m = _RANGE.match(content_range or "")
    return int(m.group(1)) if m and m.group(1) != "*" else None


def _range_total(content_range):
    m = _RANGE.match(content_range or "")
    return int(m.group(2)) if m and m.group(2) != "*" else None


class _Progress:
    """A tqdm bar when stderr is a terminal (tqdm is optional), else a log line every PROGRESS_INTERVAL_S."""

    def __init__(self, url, have, total):
        self.name, self.done, self.total, self.bar = os.path.basename(url.split("?")[0]), have, total, None
        self.last = time.monotonic()
        if sys.stderr.isatty():
            try:
                from tqdm import tqdm  # optional dependency, only for a terminal
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self.bar = tqdm(total=total, initial=have, unit="B", unit_scale=True, desc=self.name)
                return
        size = f"{total:,} bytes" if total is not None else "size not announced"
        resumed = f", resuming at {have:,}" if have else ""
        logger.info(f"downloading {url} ({size}{resumed})")

    def update(self, n):
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        elif time.monotonic() - self.last >= PROGRESS_INTERVAL_S:
            self.last = time.monotonic()
            of = f" of {self.total:,} ({100 * self.done / self.total:.0f}%)" if self.total else ""
            logger.info(f"downloading {self.name}: {self.done:,} bytes{of}")

    def close(self, complete):
        if self.bar is not None:
            self.bar.close()
        elif complete:
            logger.info(f"downloaded {self.name}: {self.done:,} bytes")
