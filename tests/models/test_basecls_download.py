"""basecls:NAME downloads that go wrong, against a local server (tests/support/http_files.py): nothing incomplete
or foreign is cached or recorded, two processes fetching one name end with one good file, and a cache variable
naming a file is one line. The served file is a small basecls-style pickle (a state dict of one array)."""
import hashlib
import os
import pickle
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from basebn.checkpoint import CheckpointError
from basebn.models.basecls_fetch import MIRROR_ENV, fetch_basecls_weights
from basebn.models.convert.basecls_weights import BASECLS_WEIGHTS
from tests.support import ROOT
from tests.support.http_files import FileServer

NAME = "mbnetv1_x025"
PAYLOAD = pickle.dumps({"state_dict": {"stem.conv.weight": np.arange(50_000, dtype=np.float32)}}, protocol=4)
SHA = hashlib.sha256(PAYLOAD).hexdigest()
FETCH = f"from basebn.models.basecls_fetch import fetch_basecls_weights; print(fetch_basecls_weights({NAME!r}))"


@pytest.fixture
def server():
    with FileServer(PAYLOAD) as srv:
        yield srv


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("BASEBN_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "basecls"


def _cached(cache):
    return sorted(f for f in os.listdir(cache) if not f.endswith(".lock")) if cache.exists() else []


def test_truncated_download_is_neither_cached_nor_recorded(server, cache, monkeypatch):
    """Half of the announced bytes: refused in one line, no file and no sha256 record (so the genuine file is not
    later refused as changed); the half stays as .part and the next run completes it."""
    monkeypatch.setenv(MIRROR_ENV, server.base("truncated"))
    with pytest.raises(CheckpointError) as info:
        fetch_basecls_weights(NAME)
    msg = str(info.value)
    assert server.base("truncated") + BASECLS_WEIGHTS[NAME] in msg and f"of the {len(PAYLOAD):,} bytes" in msg
    assert _cached(cache) == [f"{NAME}.pkl.part"]
    monkeypatch.setenv(MIRROR_ENV, server.base("whole"))
    path = fetch_basecls_weights(NAME)
    assert open(path, "rb").read() == PAYLOAD
    assert (cache / f"{NAME}.pkl.sha256").read_text().split()[0] == SHA
    assert server.requests[-1] == ("whole", f"bytes={len(PAYLOAD) // 2}-")
    assert _cached(cache) == [f"{NAME}.pkl", f"{NAME}.pkl.sha256"]


def test_html_page_is_refused_naming_the_url_and_nothing_is_cached(server, cache, monkeypatch):
    monkeypatch.setenv(MIRROR_ENV, server.base("html"))
    with pytest.raises(CheckpointError) as info:
        fetch_basecls_weights(NAME)
    msg = str(info.value)
    assert server.base("html") + BASECLS_WEIGHTS[NAME] in msg and "an HTML page" in msg
    assert "nothing was cached" in msg and "\n" not in msg
    assert _cached(cache) == []
    monkeypatch.setenv(MIRROR_ENV, server.base("whole"))  # the genuine file is then accepted
    assert open(fetch_basecls_weights(NAME), "rb").read() == PAYLOAD


def _reader(stream, lines):
    thread = threading.Thread(target=lambda: lines.extend(stream), daemon=True)
    thread.start()
    return thread


def test_two_processes_fetching_one_name_end_with_one_good_file(server, tmp_path):
    """The first process's download is held half-way by the server while a second starts: the second waits and
    uses the first's file; both succeed, the cache holds the file and its true sha256."""
    env = dict(os.environ, PYTHONPATH=ROOT, BASEBN_CACHE=str(tmp_path / "cache"),
               **{MIRROR_ENV: server.base("held")})
    procs, errs = [], [[], []]
    try:
        for i in range(2):
            procs.append(subprocess.Popen([sys.executable, "-c", FETCH], cwd=ROOT, env=env, text=True,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE))
            _reader(procs[-1].stderr, errs[i])
            if i == 0:
                assert server.first_held.wait(120), "the first process never reached the server"
        deadline = time.monotonic() + 120
        while not (len(server.requests) > 1 or any("waiting for another process" in line for line in errs[1])):
            assert time.monotonic() < deadline and procs[1].poll() is None, "".join(errs[1])
            time.sleep(0.05)
        server.release.set()
        outs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    path = tmp_path / "cache" / "basecls" / f"{NAME}.pkl"
    assert [p.returncode for p in procs] == [0, 0], "".join(errs[0] + errs[1])
    assert [out.strip() for out in outs] == [str(path)] * 2
    assert path.read_bytes() == PAYLOAD
    assert (path.parent / f"{NAME}.pkl.sha256").read_text().split()[0] == SHA
    assert len([line for line in errs[1] if "waiting for another process" in line]) == 1


@pytest.mark.parametrize("blocked", ["cache", "subfolder"])
def test_cache_path_that_is_a_file_is_one_line_exit_2(tmp_path, blocked):
    """Through the CLI: BASEBN_CACHE is a file, or its basecls/ folder is -> exit 2, one line naming the variable
    and the file, no traceback, the file untouched."""
    cache = tmp_path / "cache"
    blocker = cache if blocked == "cache" else cache / "basecls"
    blocker.parent.mkdir(exist_ok=True)
    blocker.write_text("keep me")
    env = dict(os.environ, PYTHONPATH=ROOT, BASEBN_CACHE=str(cache), **{MIRROR_ENV: "http://127.0.0.1:9/"})
    r = subprocess.run([sys.executable, "-m", "basebn.tools.convert_weights", f"basecls:{NAME}", "--arch", NAME,
                        "-o", str(tmp_path / "w.npz")], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "BASEBN_CACHE" in errors[0] and str(blocker) in errors[0]
    assert blocker.read_text() == "keep me"
