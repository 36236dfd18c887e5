"""python -m basebn.tools.zoo_rehash [NAME ...]

Re-records the config_sha256 of zoo entries (every entry, or the NAMEs) from their config files as they are
now, in ZOO/zoo.json (written atomically). basebn runs an entry's config only when it and the configs it derives
from match the recorded hashes: run this after reviewing a change to such a config (e.g. an edited
configs/fmnist_resnet20.py), instead of re-exporting the entry.
"""
import argparse
import json
import sys

from ..cli import cli_main
from ..utils.fs import atomic_write_bytes
from ..zoo import ZooError, config_hashes, config_root, entry_config_path, list_entries, zoo_index_path

__all__ = ["rehash", "main"]


def rehash(names=()):
    """Re-record config_sha256 of the entries called `names` (all when empty); returns the names whose hashes
    changed."""
    entries = list_entries()
    known = {e["name"] for e in entries}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ZooError(f"unknown zoo entr{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}; available: "
                       f"{', '.join(sorted(known))}")
    changed = []
    for entry in entries:
        if names and entry["name"] not in names:
            continue
        hashes = config_hashes(entry_config_path(entry), config_root(), f"zoo entry {entry['name']!r}")
        if entry.get("config_sha256") != hashes:
            changed.append(entry["name"])
        rebuilt = {}
        for key, value in entry.items():  # keep the field order: config_sha256 right after config
            if key != "config_sha256":
                rebuilt[key] = value
            if key == "config":
                rebuilt["config_sha256"] = hashes
        entry.clear()
        entry.update(rebuilt)
    atomic_write_bytes(zoo_index_path(), json.dumps({"entries": entries}, indent=2).encode())
    return changed


@cli_main
def main(argv=None):
    """CLI entry: re-record, then say which entries changed."""
    p = argparse.ArgumentParser(prog="python -m basebn.tools.zoo_rehash", description=__doc__.split("\n\n")[1])
    p.add_argument("names", nargs="*", help="entries to re-record (default: all)")
    changed = rehash(p.parse_args(argv).names)
    print(f"config_sha256 re-recorded in {zoo_index_path()}; changed: {', '.join(changed) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
