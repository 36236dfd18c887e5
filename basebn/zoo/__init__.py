"""The model zoo: zoo.json lists entries; weights are .npz files (sha256-verified, never unpickled).

Imports only basebn.checkpoint (the file format) and basebn.utils: never the engine (export lives in
basebn.tools.zoo_export) nor basebn.config (an entry's config is loaded by basebn.engine.build.zoo_config).
"""
from ..checkpoint import read_npz_weights, save_npz_weights
from ..utils.fs import sha256_of
from .config_files import config_hashes
from .download import cache_dir, download
from .errors import ZooError
from .index import (config_root, entry_config_path, get_entry, list_entries, load_zoo_weights, zoo_config_source,
                    zoo_dir, zoo_index_path, zoo_weights_path)

__all__ = ["ZooError", "zoo_dir", "zoo_index_path", "list_entries", "get_entry", "config_root", "entry_config_path",
           "config_hashes", "zoo_config_source", "zoo_weights_path", "load_zoo_weights", "save_npz_weights",
           "read_npz_weights", "sha256_of", "download", "cache_dir"]
