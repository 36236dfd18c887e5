"""Download a URL into a cache with a progress bar, resuming partial files, verifying sha256."""
import os
import sys
import urllib.request

from ..utils.fs import sha256_of
from .errors import ZooError

__all__ = ["download", "cache_dir"]


def cache_dir():
    """Where downloaded zoo weights go: $BASEBN_CACHE, else ~/.cache/basebn/zoo."""
    return os.environ.get("BASEBN_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "basebn", "zoo"))


def download(url, sha256, dest_dir=None, timeout=60):
    """Return the path of url's file in the cache, downloading (or finishing a partial download) if needed.

    `sha256` None (a source that publishes no hash): the file is cached under the URL's own name, an existing
    one is returned as it is, and checking it is the caller's job. `timeout` bounds connecting and each read.
    """
    dest_dir = dest_dir or cache_dir()
    os.makedirs(dest_dir, exist_ok=True)
    name = os.path.basename(url.split('?')[0])
    dest = os.path.join(dest_dir, f"{sha256[:16]}-{name}" if sha256 else name)
    if os.path.isfile(dest) and (sha256 is None or sha256_of(dest) == sha256):
        return dest
    part = dest + ".part"
    have = os.path.getsize(part) if os.path.isfile(part) else 0
    req = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            if have and resp.status != 206:  # server ignored the range: start over
                have = 0
            total = resp.headers.get("Content-Length")
            total = int(total) + have if total is not None else None
            _stream(resp, part, "ab" if have else "wb", have, total, os.path.basename(dest))
    except OSError as exc:
        raise ZooError(f"download of {url} failed ({exc}); run again to resume from {have} bytes") from exc
    got = sha256_of(part)
    if sha256 is not None and got != sha256:
        os.remove(part)
        raise ZooError(f"{url}: sha256 {got} does not match the zoo's {sha256}; the partial file was removed, "
                       f"run again to re-download")
    os.replace(part, dest)
    return dest


def _stream(resp, path, mode, have, total, name):
    bar = None
    if sys.stderr.isatty():
        from tqdm import tqdm  # optional dependency, only for a terminal

        bar = tqdm(total=total, initial=have, unit="B", unit_scale=True, desc=name)
    with open(path, mode) as f:
        while True:
            block = resp.read(1 << 16)
            if not block:
                break
            f.write(block)
            if bar is not None:
                bar.update(len(block))
    if bar is not None:
        bar.close()
