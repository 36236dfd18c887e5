import hashlib
import io
import json
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

import basebn.zoo as zoo
from basebn.checkpoint import CheckpointError
from basebn.zoo import ZooError, download, read_npz_weights, save_npz_weights
from tests.support import ROOT
from tests.support.cli import TINY
from tests.support.http_files import FileServer


@pytest.fixture
def server():
    """(URL of a 300 kB payload that honours Range requests, the server: .payload, .requests)."""
    with FileServer(os.urandom(300_000)) as srv:
        yield srv.url("whole", "w.npz"), srv


def _ranges(srv):
    return [rng for _, rng in srv.requests]


def test_download_verifies_and_resumes(server, tmp_path):
    url, handler = server
    sha = hashlib.sha256(handler.payload).hexdigest()
    dest_dir = str(tmp_path / "cache")
    os.makedirs(dest_dir)
    part = os.path.join(dest_dir, f"{sha[:16]}-w.npz.part")
    with open(part, "wb") as f:  # an interrupted earlier download
        f.write(handler.payload[:120_000])
    path = download(url, sha, dest_dir=dest_dir)
    assert open(path, "rb").read() == handler.payload
    assert _ranges(handler) == ["bytes=120000-"]  # only the missing tail was fetched
    assert not os.path.exists(part)
    download(url, sha, dest_dir=dest_dir)  # cached: no new request
    assert len(_ranges(handler)) == 1


def test_download_hash_mismatch(server, tmp_path):
    url, _ = server
    with pytest.raises(ZooError, match="does not match"):
        download(url, "0" * 64, dest_dir=str(tmp_path))
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".part")]


def test_npz_weights_round_trip_without_pickle(tmp_path):
    path = str(tmp_path / "w.npz")
    model = {"conv1.weight": np.arange(8, dtype=np.float32).reshape(2, 4)}
    ema = {"conv1.weight": np.ones((2, 4), np.float32)}
    save_npz_weights(path, model, ema, meta={"top1": 90.0})
    m, e, meta = read_npz_weights(path)
    np.testing.assert_array_equal(m["conv1.weight"], model["conv1.weight"])
    np.testing.assert_array_equal(e["conv1.weight"], ema["conv1.weight"])
    assert meta == {"top1": 90.0}
    with np.load(path, allow_pickle=False) as z:  # the file holds no object arrays
        assert all(z[k].dtype != object for k in z.files)


def test_zoo_entry_sha_check_and_unknown_name(tmp_path, monkeypatch):
    save_npz_weights(str(tmp_path / "a.npz"), {"w": np.zeros(3, np.float32)})
    sha = zoo.sha256_of(str(tmp_path / "a.npz"))
    index = {"entries": [{"name": "a", "config": "configs/quickstart.py", "weights": "a.npz", "sha256": sha},
                         {"name": "bad", "config": "configs/quickstart.py", "weights": "a.npz", "sha256": "f" * 64}]}
    (tmp_path / "zoo.json").write_text(json.dumps(index))
    monkeypatch.setenv("BASEBN_ZOO", str(tmp_path))
    np.testing.assert_array_equal(zoo.load_zoo_weights("a")["w"], np.zeros(3))
    with pytest.raises(ZooError, match="sha256"):
        zoo.load_zoo_weights("bad")
    with pytest.raises(ZooError, match="unknown zoo entry 'nope'; available: a, bad"):
        zoo.get_entry("nope")
    with pytest.raises(ZooError, match="no EMA weights"):
        zoo.load_zoo_weights("a", ema=True)


def _sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _write_zoo(folder, entries):
    (folder / "zoo.json").write_text(json.dumps({"entries": entries}))


def _bad_weights(folder):
    """name -> (file bytes, what the error says): weights files the zoo must refuse without unpickling."""
    buf = io.BytesIO()
    np.savez(buf, **{"model/w": np.array([{"a": 1}], dtype=object)})
    obj = buf.getvalue()
    buf = io.BytesIO()
    np.savez(buf, **{"model/w": np.zeros(1000, np.float32)})
    return {"pickled": (pickle.dumps({"model/w": np.zeros(3)}), "is not an .npz"),
            "objects": (obj, "object array"),
            "truncated": (buf.getvalue()[:500], "truncated or corrupt")}


def _write_bad_zoo(tmp_path):
    """A zoo of broken weights files (sha256 right) plus an entry without sha256; the config tiny.py (when it
    exists) is recorded with its hash."""
    config_sha = {"tiny.py": _sha(tmp_path / "tiny.py")} if (tmp_path / "tiny.py").exists() else None
    entries = []
    for name, (data, _) in _bad_weights(tmp_path).items():
        (tmp_path / f"{name}.npz").write_bytes(data)
        entries.append({"name": name, "config": "tiny.py", "config_sha256": config_sha, "weights": f"{name}.npz",
                        "sha256": _sha(tmp_path / f"{name}.npz")})
    entries.append({"name": "nosha", "config": "tiny.py", "config_sha256": config_sha, "weights": "pickled.npz"})
    _write_zoo(tmp_path, entries)


def test_bad_weights_files_fail_with_one_error(tmp_path, monkeypatch):
    _write_bad_zoo(tmp_path)
    monkeypatch.setenv("BASEBN_ZOO", str(tmp_path))
    for name, (_, says) in _bad_weights(tmp_path).items():
        with pytest.raises(CheckpointError, match=says):
            zoo.load_zoo_weights(name)
    with pytest.raises(ZooError, match="'nosha' has no sha256"):
        zoo.load_zoo_weights("nosha")
    (tmp_path / "zoo.json").write_text('{"entries": [{"name": "a",')
    with pytest.raises(ZooError, match="not valid JSON"):
        zoo.list_entries()
    (tmp_path / "zoo.json").write_text('{"entries": {"name": "a"}}')
    with pytest.raises(ZooError, match="malformed"):
        zoo.list_entries()


def test_cli_reports_bad_zoo_files_in_one_line(tmp_path):
    (tmp_path / "tiny.py").write_text(TINY)
    _write_bad_zoo(tmp_path)
    env = dict(os.environ, PYTHONPATH=ROOT, BASEBN_ZOO=str(tmp_path))
    cases = {name: says for name, (_, says) in _bad_weights(tmp_path).items()}
    cases["nosha"] = "has no sha256"
    for name, says in cases.items():
        r = subprocess.run([sys.executable, "-m", "basebn.test", f"zoo:{name}"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 2, (name, r.stderr)
        assert says in r.stderr and "Traceback" not in r.stderr, (name, r.stderr)
    (tmp_path / "zoo.json").write_text("{not json")
    r = subprocess.run([sys.executable, "-m", "basebn.test", "zoo:pickled"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "not valid JSON" in r.stderr and "Traceback" not in r.stderr


def test_custom_zoo_configs_are_relative_to_the_zoo_folder(tmp_path, monkeypatch):
    folder = tmp_path / "myzoo"
    (folder / "cfgs").mkdir(parents=True)
    (folder / "cfgs" / "tiny.py").write_text(TINY)
    (tmp_path / "cfgs").mkdir()
    (tmp_path / "cfgs" / "other.py").write_text(TINY)  # next to the zoo folder: never looked at
    hashes = {"cfgs/tiny.py": _sha(folder / "cfgs" / "tiny.py")}
    _write_zoo(folder, [{"name": "a", "config": "cfgs/tiny.py", "config_sha256": hashes, "weights": "a.npz",
                         "sha256": "0" * 64},
                        {"name": "b", "config": "cfgs/other.py", "config_sha256": hashes, "weights": "b.npz",
                         "sha256": "0" * 64},
                        {"name": "c", "config": str(tmp_path / "cfgs" / "other.py"), "config_sha256": hashes,
                         "weights": "c.npz", "sha256": "0" * 64}])
    monkeypatch.setenv("BASEBN_ZOO", str(folder))
    assert zoo.zoo_config_source("a") == (str(folder / "cfgs" / "tiny.py"), [])
    with pytest.raises(ZooError, match="not found"):
        zoo.zoo_config_source("b")
    with pytest.raises(ZooError, match="outside"):  # an absolute path elsewhere is refused
        zoo.zoo_config_source("c")


def test_package_arrows_point_one_way():
    """models -> zoo -> checkpoint -> utils: importing a package pulls in nothing above it. `import basebn` imports
    every subpackage on purpose, so the top package is stood in for by an empty one with the same path."""
    code = ("import os, sys, types, importlib; sys.path.insert(0, sys.argv[1]); top = types.ModuleType('basebn'); "
            "top.__path__ = [os.path.join(sys.argv[1], 'basebn')]; sys.modules['basebn'] = top; "
            "importlib.import_module(sys.argv[2]); "
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('basebn.'))))")
    forbidden = {"basebn.utils": ("basebn.checkpoint", "basebn.zoo", "basebn.models", "basebn.engine"),
                 "basebn.checkpoint": ("basebn.zoo", "basebn.models", "basebn.engine", "basebn.config"),
                 "basebn.zoo": ("basebn.models", "basebn.engine", "basebn.config", "basebn.tools"),
                 "basebn.models": ("basebn.engine", "basebn.tools")}
    for package, above in forbidden.items():
        r = subprocess.run([sys.executable, "-c", code, ROOT, package], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        loaded = r.stdout.split()
        assert not [m for m in loaded if m.startswith(above)], (package, loaded)


def test_one_resolver_reads_every_kind_of_spec(tmp_path, monkeypatch):
    from basebn.checkpoint import save_checkpoint
    from basebn.models import read_weights

    w = {"fc.weight": np.full((2, 3), 1.0, np.float32)}
    e = {"fc.weight": np.full((2, 3), 2.0, np.float32)}
    save_npz_weights(str(tmp_path / "a.npz"), w, e, meta={"name": "a"})
    _write_zoo(tmp_path, [{"name": "a", "config": "x.py", "weights": "a.npz", "sha256": _sha(tmp_path / "a.npz")}])
    monkeypatch.setenv("BASEBN_ZOO", str(tmp_path))
    with open(tmp_path / "old.pkl", "wb") as f:
        pickle.dump({"format": "basebn-checkpoint-v1", "model": w, "ema": {"module": e}}, f, protocol=4)
    run_dir = tmp_path / "run"
    save_checkpoint(str(run_dir / "latest.npz"), {"model": e, "ema": None, "epoch": 1})
    cases = [("zoo:a", False, w, "zoo:a"), ("zoo:a", True, e, "zoo:a (EMA)"),
             (str(tmp_path / "a.npz"), False, w, str(tmp_path / "a.npz")),
             (str(tmp_path / "a.npz"), True, e, f"{tmp_path / 'a.npz'} (EMA)"),
             (str(tmp_path / "old.pkl"), True, e, f"{tmp_path / 'old.pkl'} (EMA)"),
             (str(run_dir), False, e, str(run_dir / "latest.npz"))]
    for spec, ema, expected, source in cases:
        state, got_source = read_weights(spec, ema=ema)
        assert got_source == source
        np.testing.assert_array_equal(state["fc.weight"], expected["fc.weight"])
    save_checkpoint(str(run_dir / "final.npz"), {"model": w, "ema": None, "epoch": 1})  # final wins over latest
    assert read_weights(str(run_dir))[1] == str(run_dir / "final.npz")
    with pytest.raises(CheckpointError, match="holds no EMA weights"):
        read_weights(str(run_dir), ema=True)
