"""The model zoo: zoo/zoo.json lists entries; weights are .npz files (sha256-verified, never unpickled)."""
import json
import os

from ..config import load_config
from .download import ZooError, cache_dir, download
from .weights import read_npz_weights, save_npz_weights, sha256_of

__all__ = ["ZooError", "zoo_dir", "list_entries", "get_entry", "zoo_config", "zoo_weights_path",
           "load_zoo_weights", "save_npz_weights", "read_npz_weights", "sha256_of", "download", "cache_dir"]


def zoo_dir():
    """The zoo/ folder of the repository (or $BASEBN_ZOO)."""
    default = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "zoo")
    return os.environ.get("BASEBN_ZOO", default)


def list_entries():
    path = os.path.join(zoo_dir(), "zoo.json")
    if not os.path.isfile(path):
        raise ZooError(f"zoo index {path} not found (set BASEBN_ZOO to a folder holding zoo.json)")
    with open(path) as f:
        return json.load(f)["entries"]


def get_entry(name):
    entries = list_entries()
    for e in entries:
        if e["name"] == name:
            return e
    raise ZooError(f"unknown zoo entry {name!r}; available: {', '.join(e['name'] for e in entries)}")


def zoo_config(name, overrides=()):
    entry = get_entry(name)
    path = entry["config"] if os.path.isabs(entry["config"]) else os.path.join(os.path.dirname(zoo_dir()),
                                                                                entry["config"])
    return load_config(path, list(entry.get("overrides", [])) + list(overrides))


def zoo_weights_path(entry):
    """Local path of the entry's weights, sha256-verified (downloaded first when it is a URL)."""
    weights = entry["weights"]
    if weights.startswith(("http://", "https://")):
        return download(weights, entry["sha256"])
    path = weights if os.path.isabs(weights) else os.path.join(zoo_dir(), weights)
    if not os.path.isfile(path):
        raise ZooError(f"zoo entry {entry['name']!r}: weights file {path} is missing")
    got = sha256_of(path)
    if got != entry["sha256"]:
        raise ZooError(f"zoo entry {entry['name']!r}: {path} has sha256 {got}, the zoo lists {entry['sha256']}; "
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
