"""The zoo index (zoo.json): where it is, its entries, an entry's config and its sha256-verified weights.

Where: $BASEBN_ZOO, else the package data of an installed basebn (basebn/zoo_data, mapped from the
repository's zoo/ by setup.py), else the source tree's zoo/.

An entry's config is a path relative to its config root, which it may not leave: the $BASEBN_ZOO folder for a
custom zoo; for the shipped zoo the folder holding the shipped configs/ (basebn/zoo_data of an installed basebn,
where setup.py installs the repository's configs/ as basebn/zoo_data/configs, else the source tree root). Before
it runs, it and the configs it derives from must match the entry's config_sha256 (config_files.py). An entry's
weights are a file inside the zoo folder or a URL, and must match its sha256. Never the current directory.
"""
import json
import os
import re

from ..checkpoint import read_npz_weights
from ..utils.fs import sha256_of
from .config_files import is_inside, verify_config_files
from .download import download
from .errors import ZooError

__all__ = ["zoo_dir", "zoo_index_path", "list_entries", "get_entry", "config_root", "entry_config_path",
           "zoo_config_source", "zoo_weights_path", "load_zoo_weights"]

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE_ROOT = os.path.dirname(_PACKAGE)
INSTALLED_ZOO = os.path.join(_PACKAGE, "zoo_data")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def zoo_dir():
    """The folder holding zoo.json and the weights ($BASEBN_ZOO, installed package data, or the source tree's)."""
    custom = os.environ.get("BASEBN_ZOO")
    if custom:
        return custom
    if os.path.isfile(os.path.join(INSTALLED_ZOO, "zoo.json")):
        return INSTALLED_ZOO
    return os.path.join(SOURCE_ROOT, "zoo")


def zoo_index_path():
    """Path of zoo.json in zoo_dir()."""
    return os.path.join(zoo_dir(), "zoo.json")


def list_entries():
    """The entries of zoo.json (each a dict with at least a str 'name')."""
    path = zoo_index_path()
    if not os.path.isfile(path):
        raise ZooError(f"zoo index {path} not found (set BASEBN_ZOO to a folder holding zoo.json)")
    try:
        with open(path) as f:
            index = json.load(f)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ZooError(f"zoo index {path} is not valid JSON ({exc}); restore it (git checkout zoo/zoo.json)") from exc
    entries = index.get("entries") if isinstance(index, dict) else None
    if not isinstance(entries, list) or not all(isinstance(e, dict) and isinstance(e.get("name"), str)
                                                for e in entries):
        raise ZooError(f'zoo index {path} is malformed: expected {{"entries": [{{"name": ..., ...}}, ...]}}')
    return entries


def get_entry(name):
    """The zoo.json entry called `name`; an unknown name fails listing the known ones."""
    entries = list_entries()
    for e in entries:
        if e["name"] == name:
            return e
    raise ZooError(f"unknown zoo entry {name!r}; available: {', '.join(e['name'] for e in entries)}")


def config_root():
    """The folder an entry's config path is relative to (and may not leave): see this module's docstring."""
    if os.environ.get("BASEBN_ZOO"):
        return zoo_dir()
    if os.path.isdir(os.path.join(INSTALLED_ZOO, "configs")) and zoo_dir() == INSTALLED_ZOO:
        return INSTALLED_ZOO
    return SOURCE_ROOT


def entry_config_path(entry):
    """The entry's config file inside config_root(); a path that leaves it is a ZooError."""
    config, root = _field(entry, "config"), config_root()
    path = os.path.normpath(os.path.join(root, config))
    if not is_inside(path, root):
        raise ZooError(f"zoo entry {entry['name']!r}: config {config!r} lies outside {root}; a zoo entry's config "
                       f"must be inside the zoo folder (or the shipped configs); nothing was run")
    return path


def zoo_config_source(name):
    """(config file, overrides) of entry `name`, the config and the configs it derives from verified against
    the entry's config_sha256 (nothing is run); basebn.engine.build.zoo_config loads them (the zoo does not
    import basebn.config, which imports the models, which import the zoo)."""
    entry = get_entry(name)
    path = entry_config_path(entry)
    overrides = entry.get("overrides", [])
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        raise ZooError(f"zoo entry {name!r}: overrides must be a list of KEY=VALUE strings")
    verify_config_files(path, config_root(), entry.get("config_sha256"), f"zoo entry {name!r}")
    return path, list(overrides)


def zoo_weights_path(entry):
    """Local path of the entry's weights, sha256-verified (downloaded first when it is a URL)."""
    weights, sha = _field(entry, "weights"), _field(entry, "sha256")
    if not _SHA256.match(sha):
        raise ZooError(f"zoo entry {entry['name']!r}: sha256 {sha!r} is not 64 lowercase hex digits")
    if weights.startswith(("http://", "https://")):
        return download(weights, sha)
    path = os.path.normpath(os.path.join(zoo_dir(), weights))
    if not is_inside(path, zoo_dir()):
        raise ZooError(f"zoo entry {entry['name']!r}: weights {weights!r} lie outside the zoo folder {zoo_dir()}; "
                       f"an entry's weights are a file in the zoo folder or a URL")
    if not os.path.isfile(path):
        raise ZooError(f"zoo entry {entry['name']!r}: weights file {path} is missing")
    got = sha256_of(path)
    if got != sha:
        raise ZooError(f"zoo entry {entry['name']!r}: {path} has sha256 {got}, the zoo lists {sha}; "
                       f"the file is damaged or was replaced, restore it (git checkout zoo/)")
    return path


def load_zoo_weights(name, ema=False):
    """Model state (numpy dict) of zoo entry `name`; the EMA weights with ema=True."""
    model, ema_state, _ = read_npz_weights(zoo_weights_path(get_entry(name)))
    if ema:
        if ema_state is None:
            raise ZooError(f"zoo entry {name!r} has no EMA weights")
        return ema_state
    return model


def _field(entry, key):
    value = entry.get(key)
    if not isinstance(value, str) or not value:
        why = "refusing to load weights it cannot verify" if key == "sha256" else "add it to zoo.json"
        raise ZooError(f"zoo entry {entry.get('name')!r} has no {key}; {why}")
    return value
