"""Fixtures shared by the data tests: a private file-list cache, log capture."""
import pytest
from loguru import logger


@pytest.fixture
def data_cache(tmp_path, monkeypatch):
    """BASEBN_DATA_CACHE in the test's own folder (no file list cached by another test is reused)."""
    monkeypatch.setenv("BASEBN_DATA_CACHE", str(tmp_path / "cache"))


def _capture(level):
    seen = []
    sink = logger.add(lambda m: seen.append(str(m)), level=level, format="{message}")
    return seen, sink


@pytest.fixture
def logs():
    """Messages logged at INFO and above during the test."""
    seen, sink = _capture("INFO")
    yield seen
    logger.remove(sink)


@pytest.fixture
def warnings():
    """Messages logged at WARNING and above during the test."""
    seen, sink = _capture("WARNING")
    yield seen
    logger.remove(sink)
