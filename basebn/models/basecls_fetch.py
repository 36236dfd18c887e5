"""``basecls:NAME``: basecls's published ImageNet weights for model NAME, downloaded once into a cache.

The URL is basecls's (convert/basecls_weights.py, generated from its ``@hub.pretrained`` decorators);
``$BASEBN_BASECLS_URL`` replaces its prefix up to and including ``/basecls/models/`` (a mirror, or a local
server). Files go to ``$BASEBN_CACHE/basecls`` (else ``~/.cache/basebn/basecls``) through the zoo's downloader
(zoo/download.py: one process per file, a partial file resumed, moved into place only when whole). A download
is kept only when it loads as basecls weights (the restricted unpickler: a dict); an HTML page or a truncated
pickle is removed with one line. basecls publishes no hashes, so the first kept download's sha256 is recorded
beside the file (``NAME.pkl.sha256``) and a later file that differs is refused. Like every basecls checkpoint,
the file is then converted by :func:`basebn.models.weights.read_foreign_state` (BGR image-input convs turned to
RGB: convert/channel_order.py).
"""
import functools
import os

from ..checkpoint import CheckpointError
from ..checkpoint.legacy import load_restricted_pickle
from ..utils.fs import atomic_write_bytes, sha256_of
from ..zoo import ZooError, download
from ..zoo.download import describe_content
from ..zoo.errors import DownloadError
from .convert.basecls_weights import BASECLS_ONLY, BASECLS_URL_PREFIX, BASECLS_WEIGHTS

__all__ = ["MIRROR_ENV", "DOWNLOAD_TIMEOUT", "is_basecls_name", "check_basecls_name", "basecls_url",
           "basecls_cache_dir", "fetch_basecls_weights"]

MIRROR_ENV = "BASEBN_BASECLS_URL"
DOWNLOAD_TIMEOUT = 30  # seconds to connect and per read: no network is an error, never a hang


def is_basecls_name(ref):
    """`ref` (what follows ``basecls:``) is a model name, not a path: no path separator and no such file."""
    return bool(ref) and "/" not in ref and os.sep not in ref and not os.path.exists(ref)


def basecls_url(name):
    """The URL of NAME's published weights, under $BASEBN_BASECLS_URL when set."""
    prefix = os.environ.get(MIRROR_ENV) or BASECLS_URL_PREFIX
    return prefix.rstrip("/") + "/" + BASECLS_WEIGHTS[name]


def basecls_cache_dir():
    """Where basecls's weights are cached: $BASEBN_CACHE/basecls, else ~/.cache/basebn/basecls."""
    root = os.environ.get("BASEBN_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "basebn")
    return os.path.join(root, "basecls")


def check_basecls_name(name):
    """Raise CheckpointError (one line) unless basecls publishes weights for `name` and basebn builds it."""
    if name in BASECLS_WEIGHTS:
        return
    if name in BASECLS_ONLY:
        raise CheckpointError(f"basecls:{name}: basecls publishes weights for {name} but basebn has no such model "
                              f"(basebn.models.list_models() lists what it builds)")
    raise CheckpointError(f"basecls:{name}: no such file, and not a basecls model name with published weights "
                          f"(e.g. basecls:resnet18; the {len(BASECLS_WEIGHTS)} names: README 'Weights from basecls "
                          f"and timm'); a path needs a directory part (basecls:./{name})")


def fetch_basecls_weights(name, timeout=DOWNLOAD_TIMEOUT):
    """The cached file of basecls's published weights for model `name` (downloaded on first use); raises
    CheckpointError, one line, when it cannot be had, is not basecls weights or differs from the recorded sha256."""
    check_basecls_name(name)
    url, folder = basecls_url(name), basecls_cache_dir()
    record = os.path.join(folder, os.path.basename(url)) + ".sha256"
    try:
        path = download(url, None, folder, timeout=timeout, check=functools.partial(_check_download, url, record))
    except ZooError as exc:
        hint = (f"; set {MIRROR_ENV} to a mirror of {BASECLS_URL_PREFIX} (or pass basecls:PATH of a downloaded "
                f"file)") if getattr(exc, "network", False) else ""
        raise CheckpointError(f"basecls:{name}: {exc}{hint}") from None
    got = sha256_of(path)
    want = _recorded_sha256(record)
    if want is None:
        atomic_write_bytes(record, f"{got}  {os.path.basename(path)}\n".encode())
        return path
    if got == want:
        return path
    raise CheckpointError(f"basecls:{name}: the cached {path} has sha256 {got}, its first download had {want} "
                          f"({record}); delete the file to download it again, or the record to trust it")


def _recorded_sha256(record):
    if not os.path.isfile(record):
        return None
    with open(record) as f:
        return f.read().split()[0]


def _check_download(url, record, path):
    """Raise DownloadError unless the downloaded `path` loads as basecls weights (a dict, read by the restricted
    unpickler) and matches the recorded sha256 when there is one."""
    try:
        data = load_restricted_pickle(path)
    except CheckpointError as exc:
        raise DownloadError(f"{url} sent {describe_content(path)}, not a pickle of basecls weights "
                            f"({exc.__cause__ or exc}); it was removed, nothing was cached: check the URL (a proxy's "
                            f"or login page?) and run again") from None
    if not (isinstance(data, dict) and data):
        raise DownloadError(f"{url} sent a pickle of {type(data).__name__}, not basecls weights (a dict of arrays); "
                            f"it was removed, nothing was cached")
    want, got = _recorded_sha256(record), sha256_of(path)
    if want is not None and got != want:
        raise DownloadError(f"{url} now has sha256 {got}, its first download had {want} ({record}); the new file "
                            f"was removed. Delete the record to accept it")
