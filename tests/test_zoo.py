import hashlib
import http.server
import json
import os
import threading

import numpy as np
import pytest

import basebn.zoo as zoo
from basebn.zoo import ZooError, download, read_npz_weights, save_npz_weights


class RangeHandler(http.server.BaseHTTPRequestHandler):
    payload = b""
    ranges = []

    def do_GET(self):
        rng = self.headers.get("Range")
        type(self).ranges.append(rng)
        data = self.payload
        if rng:
            start = int(rng.split("=")[1].split("-")[0])
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            data = data[start:]
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    RangeHandler.payload = os.urandom(300_000)
    RangeHandler.ranges = []
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), RangeHandler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/w.npz", RangeHandler
    srv.shutdown()


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
    assert handler.ranges == ["bytes=120000-"]  # only the missing tail was fetched
    assert not os.path.exists(part)
    download(url, sha, dest_dir=dest_dir)  # cached: no new request
    assert len(handler.ranges) == 1


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
