"""The downloader against misbehaving servers (tests/support/http_files.py, 127.0.0.1): a file is moved into the
cache only when whole, a stale partial file never blocks, no download is endless, one process downloads a file
at a time, progress is logged without a terminal, and a cache path that is a file is one line."""
import fcntl
import hashlib
import importlib
import os
import threading
import time

import pytest
from loguru import logger

from basebn.zoo import ZooError, download
from tests.support.http_files import FileServer

download_module = importlib.import_module("basebn.zoo.download")  # the package's `download` is the function

PAYLOAD = bytes(range(256)) * 1200  # 307,200 bytes
SHA = hashlib.sha256(PAYLOAD).hexdigest()


@pytest.fixture
def server():
    with FileServer(PAYLOAD) as srv:
        yield srv


@pytest.fixture
def log_lines():
    lines = []
    sink = logger.add(lambda m: lines.append(str(m).rstrip("\n")), level="INFO", format="{message}")
    yield lines
    logger.remove(sink)


def _files(folder):
    return sorted(f for f in os.listdir(folder) if not f.endswith(".lock"))


def test_truncated_body_is_kept_as_part_and_resumed(server, tmp_path):
    """Content-Length announced, half sent: an error naming both sizes, nothing in place, the half kept; the next
    run asks for the rest only and ends with the whole file."""
    cache = str(tmp_path / "cache")
    url = server.url("truncated")
    with pytest.raises(ZooError, match=f"ended after {len(PAYLOAD) // 2:,} of the {len(PAYLOAD):,} bytes") as info:
        download(url, None, dest_dir=cache)
    assert url in str(info.value) and "\n" not in str(info.value)
    assert _files(cache) == ["w.bin.part"]
    assert os.path.getsize(os.path.join(cache, "w.bin.part")) == len(PAYLOAD) // 2
    os.rename(os.path.join(cache, "w.bin.part"), os.path.join(cache, "whole.bin.part"))  # same file, whole server
    path = download(server.url("whole", "whole.bin"), None, dest_dir=cache)
    assert open(path, "rb").read() == PAYLOAD
    assert server.requests[-1] == ("whole", f"bytes={len(PAYLOAD) // 2}-")


def test_part_larger_than_the_file_is_discarded_and_the_download_restarts(server, tmp_path, log_lines):
    """A .part longer than the file: the server answers 416; the .part is discarded, with a line naming it."""
    cache = tmp_path / "cache"
    cache.mkdir()
    part = cache / f"{SHA[:16]}-w.bin.part"
    part.write_bytes(b"x" * (len(PAYLOAD) + 1000))
    path = download(server.url("whole"), SHA, dest_dir=str(cache))
    assert open(path, "rb").read() == PAYLOAD and not part.exists()
    assert [line for line in log_lines if str(part) in line and "discarded" in line]


def test_part_the_server_will_not_resume_is_discarded(server, tmp_path, log_lines):
    """416 to every Range request: the .part (here a wrong beginning) goes and the whole file comes."""
    cache = tmp_path / "cache"
    cache.mkdir()
    part = cache / f"{SHA[:16]}-w.bin.part"
    part.write_bytes(b"junk" * 100)
    path = download(server.url("norange"), SHA, dest_dir=str(cache))
    assert open(path, "rb").read() == PAYLOAD and not part.exists()
    assert [line for line in log_lines if str(part) in line and "416" in line]
    assert [rng for _, rng in server.requests] == ["bytes=400-", None]


def test_whole_part_left_by_a_killed_download_is_used(server, tmp_path):
    """A .part holding the whole file (killed before its rename): 416 says so, the .part is verified and used."""
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / f"{SHA[:16]}-w.bin.part").write_bytes(PAYLOAD)
    path = download(server.url("whole"), SHA, dest_dir=str(cache))
    assert open(path, "rb").read() == PAYLOAD
    assert server.requests == [("whole", f"bytes={len(PAYLOAD)}-")]


def test_endless_body_is_cut_at_the_limit(server, tmp_path, monkeypatch):
    monkeypatch.setattr(download_module, "MAX_DOWNLOAD_BYTES", 1 << 20, raising=False)
    cache = str(tmp_path / "cache")
    url = server.url("endless")
    with pytest.raises(ZooError, match="download limit of 1,048,576 bytes") as info:
        download(url, None, dest_dir=cache)
    assert url in str(info.value) and "nothing was cached" in str(info.value)
    assert _files(cache) == []


def test_announced_size_above_the_limit_is_refused_before_downloading(server, tmp_path):
    cache = str(tmp_path / "cache")
    with pytest.raises(ZooError, match=f"announces {len(PAYLOAD):,} bytes, more than the download limit"):
        download(server.url("whole"), None, dest_dir=cache, max_bytes=1000)
    assert _files(cache) == []


def test_progress_lines_without_a_terminal(server, tmp_path, monkeypatch, log_lines):
    monkeypatch.setattr(download_module, "PROGRESS_INTERVAL_S", 0.0, raising=False)
    url = server.url("whole")
    download(url, SHA, dest_dir=str(tmp_path / "cache"))
    assert f"downloading {url} ({len(PAYLOAD):,} bytes)" in log_lines
    steps = [line for line in log_lines if line.startswith("downloading w.bin: ") and line.endswith("%)")]
    assert len(steps) >= 2 and steps[-1] == f"downloading w.bin: {len(PAYLOAD):,} bytes of {len(PAYLOAD):,} (100%)"


def test_html_page_is_refused_by_the_hash_and_named(server, tmp_path):
    cache = str(tmp_path / "cache")
    with pytest.raises(ZooError, match="what arrived: an HTML page") as info:
        download(server.url("html"), SHA, dest_dir=cache)
    assert "nothing was cached" in str(info.value)
    assert _files(cache) == []


def test_second_downloader_waits_for_the_lock_then_uses_the_finished_file(server, tmp_path, log_lines):
    """Another process holds the file's lock (an flock taken here, as that process would): the download says once
    that it waits, sends no request, and returns the file the holder put in place."""
    cache = tmp_path / "cache"
    cache.mkdir()
    dest = cache / f"{SHA[:16]}-w.bin"
    result = {}
    with open(str(dest) + ".lock", "w") as holder:
        fcntl.flock(holder.fileno(), fcntl.LOCK_EX)
        worker = threading.Thread(target=lambda: result.update(path=download(server.url("whole"), SHA,
                                                                              dest_dir=str(cache))), daemon=True)
        worker.start()
        deadline = time.monotonic() + 60
        while not [line for line in log_lines if "waiting for another process downloading w.bin" in line]:
            assert time.monotonic() < deadline and worker.is_alive(), "the download did not wait for the lock"
            time.sleep(0.05)
        dest.write_bytes(PAYLOAD)  # what the holder downloaded
        fcntl.flock(holder.fileno(), fcntl.LOCK_UN)
    worker.join(60)
    assert result.get("path") == str(dest) and dest.read_bytes() == PAYLOAD
    assert server.requests == []
    assert len([line for line in log_lines if "waiting for another process" in line]) == 1


def test_cache_variable_naming_a_file_is_one_line(tmp_path, monkeypatch):
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("x")
    monkeypatch.setenv("BASEBN_CACHE", str(blocker))
    with pytest.raises(ZooError) as info:
        download("http://127.0.0.1:9/w.bin", SHA)
    msg = str(info.value)
    assert f"BASEBN_CACHE={blocker}" in msg and "is a file, not a folder" in msg and "\n" not in msg
    assert blocker.read_text() == "x"
