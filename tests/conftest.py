import pytest

from tests.support import ROOT
from tests.support.cli import TINY
from tests.support.mpi_launch import mpi_skip_reason


def pytest_collection_modifyitems(items):
    """Tests marked `mpi` skip, with the reason, where mpi4py or mpiexec is missing."""
    reason = mpi_skip_reason()
    if reason:
        for item in items:
            if "mpi" in item.keywords:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def repo_root():
    return ROOT


@pytest.fixture
def tiny(tmp_path):
    """Path of a tiny experiment file: synthetic 8x8 data, ResNet-20 width 4, 2 epochs (seconds on a CPU)."""
    path = tmp_path / "tiny.py"
    path.write_text(TINY)
    return str(path)
