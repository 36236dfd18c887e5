"""Issue R defect 10: a zoo entry runs only configs inside its zoo folder whose sha256 zoo.json records (the
configs they derive from included), and reads weights only from inside the zoo folder. Each refused case is
one line, exit 2, and the config never ran (it would have written a marker file)."""
import hashlib
import json

import numpy as np
import pytest

import basebn.test as basebn_test
import basebn.zoo as zoo
from basebn.engine.build import zoo_config
from basebn.zoo import ZooError, save_npz_weights
from tests.support.cli import TINY

DERIVED = """
from basebn.config import config_class
Base = config_class("base.py", relative_to=__file__)
class Cfg(Base):
    pass
"""


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _marking(marker):
    """TINY plus a line that writes `marker` when the config is run."""
    return TINY + f"\nopen({str(marker)!r}, 'w').write('the config ran')\n"


@pytest.fixture
def folder(tmp_path, monkeypatch):
    zoo_folder = tmp_path / "zoo"
    zoo_folder.mkdir()
    save_npz_weights(str(zoo_folder / "w.npz"), {"w": np.zeros(2, np.float32)})
    monkeypatch.setenv("BASEBN_ZOO", str(zoo_folder))
    return zoo_folder


def _entry(name, config, hashes, weights="w.npz", folder=None):
    sha = _sha(folder / weights) if folder is not None and (folder / weights).exists() else "0" * 64
    return {"name": name, "config": config, "config_sha256": hashes, "weights": weights, "sha256": sha}


def _refused(name, capsys, says):
    """basebn.test zoo:NAME exits 2 with one error line containing `says`."""
    assert basebn_test.main([f"zoo:{name}"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and says in err[0], err


def test_configs_outside_the_zoo_folder_never_run(folder, tmp_path, capsys):
    marker = tmp_path / "ran"
    evil = tmp_path / "evil.py"
    evil.write_text(_marking(marker))
    hashes = {"../evil.py": _sha(evil), str(evil): _sha(evil), "evil.py": _sha(evil)}
    (folder / "zoo.json").write_text(json.dumps({"entries": [
        _entry("absolute", str(evil), hashes, folder=folder), _entry("dotdot", "../evil.py", hashes, folder=folder)]}))
    for name in ("absolute", "dotdot"):
        _refused(name, capsys, "outside")
    assert not marker.exists()


def test_configs_without_a_matching_hash_never_run(folder, tmp_path, capsys):
    marker = tmp_path / "ran"
    (folder / "cfg.py").write_text(_marking(marker))
    recorded = {"cfg.py": hashlib.sha256(TINY.encode()).hexdigest()}  # the hash of what it held before
    (folder / "zoo.json").write_text(json.dumps({"entries": [
        _entry("nohash", "cfg.py", None, folder=folder), _entry("tampered", "cfg.py", recorded, folder=folder),
        _entry("other_key", "cfg.py", {"else.py": _sha(folder / "cfg.py")}, folder=folder)]}))
    _refused("nohash", capsys, "no config_sha256")
    _refused("tampered", capsys, "changed after the entry was recorded")
    _refused("other_key", capsys, "has no sha256")
    assert not marker.exists()


def test_a_changed_or_unrecorded_base_config_never_runs(folder, tmp_path, capsys):
    """The entry's own config is intact; the config it derives from was changed (or is not recorded)."""
    marker = tmp_path / "ran"
    (folder / "cfgs").mkdir()
    (folder / "cfgs" / "derived.py").write_text(DERIVED)
    (folder / "cfgs" / "base.py").write_text(TINY)
    hashes = {key: _sha(folder / key) for key in ("cfgs/derived.py", "cfgs/base.py")}
    entries = [_entry("good", "cfgs/derived.py", hashes, folder=folder),
               _entry("unrecorded_base", "cfgs/derived.py", {"cfgs/derived.py": hashes["cfgs/derived.py"]},
                      folder=folder)]
    (folder / "zoo.json").write_text(json.dumps({"entries": entries}))
    assert zoo_config("good").model.base_width == 4  # recorded and intact: it loads (TINY's value)
    _refused("unrecorded_base", capsys, "cfgs/base.py")
    (folder / "cfgs" / "base.py").write_text(_marking(marker))
    _refused("good", capsys, "changed after the entry was recorded")
    assert not marker.exists()


def test_weights_outside_the_zoo_folder_are_refused(folder, tmp_path):
    save_npz_weights(str(tmp_path / "outside.npz"), {"w": np.ones(2, np.float32)})
    sha = _sha(tmp_path / "outside.npz")
    (folder / "zoo.json").write_text(json.dumps({"entries": [
        {"name": "dotdot", "config": "c.py", "weights": "../outside.npz", "sha256": sha},
        {"name": "absolute", "config": "c.py", "weights": str(tmp_path / "outside.npz"), "sha256": sha}]}))
    for name in ("dotdot", "absolute"):
        with pytest.raises(ZooError, match="outside the zoo folder"):
            zoo.load_zoo_weights(name)


def test_rehash_records_a_reviewed_config_change(folder, capsys):
    from basebn.tools.zoo_rehash import main as rehash_main

    (folder / "cfg.py").write_text(TINY)
    (folder / "zoo.json").write_text(json.dumps({"entries": [_entry("a", "cfg.py", None, folder=folder),
                                                             _entry("b", "cfg.py", None, folder=folder)]}))
    with pytest.raises(ZooError, match="no config_sha256"):
        zoo.zoo_config_source("a")
    assert rehash_main(["a"]) == 0
    assert "changed: a" in capsys.readouterr().out
    entries = {e["name"]: e for e in json.loads((folder / "zoo.json").read_text())["entries"]}
    assert entries["a"]["config_sha256"] == {"cfg.py": hashlib.sha256(TINY.encode()).hexdigest()}
    assert entries["b"]["config_sha256"] is None  # only the entry named
    assert list(entries["a"])[:3] == ["name", "config", "config_sha256"]
    assert zoo_config("a").model.base_width == 4
    assert rehash_main(["nope"]) == 2
