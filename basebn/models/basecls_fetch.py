"""``basecls:NAME``: basecls's published ImageNet weights for model NAME, downloaded once into a cache.

The URL is basecls's (convert/basecls_weights.py, generated from its ``@hub.pretrained`` decorators);
``$BASEBN_BASECLS_URL`` replaces its prefix up to and including ``/basecls/models/`` (a mirror, or a local
server). Files go to ``$BASEBN_CACHE/basecls`` (else ``~/.cache/basebn/basecls``) through the zoo's downloader
(progress bar on a terminal, a partial file resumed, renamed into place when complete). basecls publishes
no hashes, so the first download's sha256 is recorded beside the file (``NAME.pkl.sha256``) and a later
file that differs is refused. Like every basecls checkpoint, the file is then converted by
:func:`basebn.models.weights.read_foreign_state` (BGR image-input convs turned to RGB: convert/channel_order.py).
"""
import os


from ..checkpoint import CheckpointError
from ..utils.fs import atomic_write_bytes, sha256_of
from ..zoo import ZooError, download
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
    CheckpointError, one line, when it cannot be had or differs from the first download's sha256."""
    check_basecls_name(name)
    url, folder = basecls_url(name), basecls_cache_dir()
    dest = os.path.join(folder, os.path.basename(url))
    record, cached = dest + ".sha256", os.path.isfile(dest)
    try:
        path = download(url, None, folder, timeout=timeout)
    except ZooError as exc:
        reason = exc.__cause__ if exc.__cause__ is not None else exc
        raise CheckpointError(f"basecls:{name}: cannot download {url} ({reason}); set {MIRROR_ENV} to a mirror of "
                              f"{BASECLS_URL_PREFIX} (or pass basecls:PATH of a downloaded file)") from None
    got = sha256_of(path)
    if not os.path.isfile(record):
        atomic_write_bytes(record, f"{got}  {os.path.basename(path)}\n".encode())
        return path
    with open(record) as f:
        want = f.read().split()[0]
    if got == want:
        return path
    if cached:
        raise CheckpointError(f"basecls:{name}: the cached {path} has sha256 {got}, its first download had {want} "
                              f"({record}); delete the file to download it again, or the record to trust it")
    os.remove(path)  # refused: a later download that differs from the first
    raise CheckpointError(f"basecls:{name}: {url} now has sha256 {got}, its first download had {want} ({record}); "
                          f"the new file was removed. Delete the record to accept it")
