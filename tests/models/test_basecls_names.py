"""basecls:NAME end to end against a local HTTP server (issue Q part 2): the mirror variable, the cache, the
sha256 record and the refusal of a changed file, the offline error, the table against basecls's source.

The served file was written by basecls's own code (scripts/basecls_published_fixture.py: basecls's
mbnetv1_x025 with a 10-class head, dumped by ``mge.save`` as its training does, made a zoo file by its
``basecls.zoo.utils.purify_weight``), and the reference logits are basecls's model's on the BGR image whose
RGB version basebn gets. The server is ``http.server`` on 127.0.0.1 in a thread; nothing leaves the machine.
"""
import functools
import hashlib
import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import threading

import megengine as mge
import numpy as np
import pytest

from basebn.checkpoint import CheckpointError
from basebn.models import build_model, list_models, load_weights
from basebn.models.basecls_fetch import MIRROR_ENV, basecls_url, fetch_basecls_weights
from basebn.models.convert.basecls_weights import (BASECLS_COMMIT, BASECLS_ONLY, BASECLS_URL_PREFIX,
                                                   BASECLS_WEIGHTS)
from tests.support import ROOT

SERVED = os.path.join(ROOT, "tests", "fixtures", "basecls_published")
FIXTURE = json.load(open(os.path.join(SERVED, "mbnetv1_x025.json")))
NAME = FIXTURE["name"]
TOL = 1e-4


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def server(tmp_path):
    """A copy of the fixture folder served on 127.0.0.1: (base URL, served folder)."""
    folder = tmp_path / "served"
    shutil.copytree(SERVED, folder)
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(folder)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/", folder
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def mirror(server, tmp_path, monkeypatch):
    url, folder = server
    monkeypatch.setenv(MIRROR_ENV, url)
    monkeypatch.setenv("BASEBN_CACHE", str(tmp_path / "cache"))
    return url, folder


def _logits(model):
    rgb = np.random.default_rng(FIXTURE["input_seed"]).uniform(
        -2, 2, size=(FIXTURE["batch"], 3, FIXTURE["size"], FIXTURE["size"])).astype(np.float32)
    model.eval()
    return model(mge.tensor(rgb)).numpy()


def test_published_name_gives_basecls_logits_on_the_rgb_image(mirror, tmp_path):
    model = build_model(NAME, num_classes=FIXTURE["num_classes"])
    load_weights(model, f"basecls:{NAME}")
    assert np.abs(_logits(model) - np.asarray(FIXTURE["logits"], np.float32)).max() <= TOL
    cached = tmp_path / "cache" / "basecls" / f"{NAME}.pkl"
    digest = hashlib.sha256(cached.read_bytes()).hexdigest()
    assert digest == FIXTURE["sha256"]
    assert (tmp_path / "cache" / "basecls" / f"{NAME}.pkl.sha256").read_text().split()[0] == digest


def test_path_keeps_meaning_a_file_and_loads_as_is(monkeypatch):
    """basecls:PATH (a separator, or an existing file) is a path: no download, no channel reversal, so the
    logits are basecls's on the same (unreversed) tensor -- checked through the reversal's exactness."""
    src = os.path.join(SERVED, "mbnet", NAME, f"{NAME}.pkl")
    by_path = build_model(NAME, num_classes=10)
    load_weights(by_path, f"basecls:{src}")
    w = by_path.stem.conv.weight.numpy()
    by_name_state = {k: np.asarray(v) for k, v in by_path.state_dict().items()}
    by_name_state["stem.conv.weight"] = np.ascontiguousarray(w[:, ::-1])
    flipped = build_model(NAME, num_classes=10)
    flipped.load_state_dict(by_name_state)
    assert np.abs(_logits(flipped) - np.asarray(FIXTURE["logits"], np.float32)).max() <= TOL
    monkeypatch.chdir(os.path.dirname(src))  # an existing file without a separator is a path too
    again = build_model(NAME, num_classes=10)
    load_weights(again, f"basecls:{NAME}.pkl")
    np.testing.assert_array_equal(again.stem.conv.weight.numpy(), w)


def test_second_use_comes_from_the_cache(mirror):
    url, folder = mirror
    fetch_basecls_weights(NAME)
    shutil.rmtree(folder / "mbnet")  # the server no longer has it
    path = fetch_basecls_weights(NAME)
    assert os.path.basename(path) == f"{NAME}.pkl"


def test_a_changed_file_is_refused_naming_both_hashes(mirror, tmp_path):
    url, folder = mirror
    path = fetch_basecls_weights(NAME)
    first = hashlib.sha256(open(path, "rb").read()).hexdigest()
    os.remove(path)  # a later download...
    served = folder / "mbnet" / NAME / f"{NAME}.pkl"
    served.write_bytes(served.read_bytes() + b"\0")  # ...of a file that changed on the server
    second = hashlib.sha256(served.read_bytes()).hexdigest()
    with pytest.raises(CheckpointError) as info:
        fetch_basecls_weights(NAME)
    msg = str(info.value)
    assert first in msg and second in msg and "\n" not in msg
    assert not os.path.exists(path)  # the refused download is not left to be used
    shutil.copy(served, path)  # a cached file that differs from the record is refused too, and kept
    with pytest.raises(CheckpointError, match=first):
        fetch_basecls_weights(NAME)
    assert os.path.isfile(path)


def test_mirror_variable_replaces_the_prefix(monkeypatch):
    monkeypatch.delenv(MIRROR_ENV, raising=False)
    assert basecls_url("resnet18") == "https://data.megengine.org.cn/research/basecls/models/resnet/resnet18/resnet18.pkl"
    monkeypatch.setenv(MIRROR_ENV, "http://127.0.0.1:8000/")
    assert basecls_url("resnet18") == "http://127.0.0.1:8000/resnet/resnet18/resnet18.pkl"


def _closed_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_offline_is_one_line_naming_the_url_and_the_mirror_variable(tmp_path):
    """Through the CLI: nothing listens at the mirror -> exit 2, one line, no traceback."""
    port = _closed_port()
    env = dict(os.environ, PYTHONPATH=ROOT, BASEBN_CACHE=str(tmp_path / "cache"),
               **{MIRROR_ENV: f"http://127.0.0.1:{port}/"})
    out = str(tmp_path / "w.npz")
    r = subprocess.run([sys.executable, "-m", "basebn.tools.convert_weights", f"basecls:{NAME}", "--arch", NAME,
                        "-o", out], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if f"http://127.0.0.1:{port}/mbnet/{NAME}/{NAME}.pkl" in line]
    assert len(errors) == 1 and MIRROR_ENV in errors[0] and "Traceback" not in r.stderr
    assert not os.path.exists(out)


def test_a_silent_server_times_out(tmp_path, monkeypatch):
    """A server that accepts and never answers: the download gives up after the timeout, it does not hang."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    monkeypatch.setenv(MIRROR_ENV, f"http://127.0.0.1:{listener.getsockname()[1]}/")
    monkeypatch.setenv("BASEBN_CACHE", str(tmp_path / "cache"))
    try:
        with pytest.raises(CheckpointError, match="timed out"):
            fetch_basecls_weights(NAME, timeout=1)
    finally:
        listener.close()


def test_convert_weights_takes_a_name(mirror, tmp_path):
    out = str(tmp_path / "w.npz")
    env = dict(os.environ, PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-m", "basebn.tools.convert_weights", f"basecls:{NAME}", "--arch", NAME,
                        "--num-classes", "10", "-o", out], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    model = build_model(NAME, num_classes=10)
    load_weights(model, out)
    assert np.abs(_logits(model) - np.asarray(FIXTURE["logits"], np.float32)).max() <= TOL


def test_names_that_do_not_fit_are_refused_in_one_line(mirror):
    model = build_model("resnet18", num_classes=10)
    with pytest.raises(CheckpointError, match="model.name=mbnetv1_x025"):
        load_weights(model, f"basecls:{NAME}")
    with pytest.raises(CheckpointError, match="basebn has no such model"):
        load_weights(model, f"basecls:{BASECLS_ONLY[0]}")
    with pytest.raises(CheckpointError, match="not a basecls model name"):
        fetch_basecls_weights("resnet_19")


def _decorated_names(source):
    """basecls's names with ``@hub.pretrained(`` above their def, by a plain text scan of its source."""
    names = {}
    for fname in os.listdir(os.path.join(source, "basecls", "models")):
        text = open(os.path.join(source, "basecls", "models", fname)).read() if fname.endswith(".py") else ""
        for chunk in text.split("@hub.pretrained(")[1:]:
            url = "".join(part.split('"')[1] for part in chunk.split(")")[0].splitlines() if '"' in part)
            names[chunk.split("def ", 1)[1].split("(", 1)[0]] = url
    return names


def test_table_covers_every_shared_name_with_weights():
    assert len(BASECLS_COMMIT) == 40 and BASECLS_URL_PREFIX.endswith("/basecls/models/")
    assert set(BASECLS_WEIGHTS) <= set(list_models()) and not set(BASECLS_ONLY) & set(list_models())
    assert all(path.endswith(f"/{name}/{name}.pkl") for name, path in BASECLS_WEIGHTS.items())
    source = "/tmp/basecls_src"
    if not os.path.isdir(os.path.join(source, "basecls", "models")):
        pytest.skip("no basecls checkout at /tmp/basecls_src (scripts/gen_basecls_weights.py says how)")
    theirs = _decorated_names(source)
    assert len(theirs) == len(BASECLS_WEIGHTS) + len(BASECLS_ONLY)
    assert {n: BASECLS_URL_PREFIX + p for n, p in BASECLS_WEIGHTS.items()} == \
        {n: u for n, u in theirs.items() if n in BASECLS_WEIGHTS}
