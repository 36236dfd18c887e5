"""Fixtures shared by every test, and what `make test` runs in parallel (pytest-xdist, --dist loadfile).

`make test` runs the tests in two steps: first every test but those marked ``mpi`` or ``serial`` in parallel, each
file on one worker (its module fixtures are made once), the long files (:data:`LONG_FILES`) first so that none is
left running alone at the end; then the MPI launches and the tests of :data:`SERIAL_TESTS` one at a time, with the
machine's cores to themselves.
"""
import pytest
from loguru import logger

from tests.support import ROOT
from tests.support.cli import TINY
from tests.support.build_cache import cached_build
from tests.support.cuda_build import NVCC, build as build_cuda, cache_key as cuda_cache_key, succeeded
from tests.support.mpi_launch import mpi_skip_reason
from tests.support.shared_build import build_once

# marked `serial` (node ids, or their beginnings): the check that orphan data workers are gone within seconds of a
# signal; the page-fault count of glibc's default heap, which depends on which of MegEngine's threads frees a block
# first, and so on the load
SERIAL_TESTS = ("tests/integration/test_data_workers_cli.py::test_no_orphan_workers_when_the_trainer_is_stopped",
                "tests/utils/test_cpu_runtime.py::test_megengine_tensors_are_not_faulted_in_again_each_step")
# the files that take minutes (every model built, nvcc and C++ builds, many CLI runs): started first in the
# parallel step, longest first
LONG_FILES = ("tests/models/test_model_families.py", "tests/ops/test_kernels_cuda_compile.py",
              "tests/tools/test_cuda_harness.py", "tests/integration/test_train_cli.py",
              "tests/deploy/test_families.py", "tests/ops/test_conv_dnnl.py")


def _file(item):
    return item.nodeid.split("::", 1)[0]


@pytest.hookimpl(tryfirst=True)  # before -m reads the marks
def pytest_collection_modifyitems(config, items):
    """Tests marked `mpi` skip, with the reason, where mpi4py or mpiexec is missing; the tests of SERIAL_TESTS are
    marked `serial`; under pytest-xdist the long files go first."""
    reason = mpi_skip_reason()
    for item in items:
        if reason and "mpi" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=reason))
        if item.nodeid.startswith(SERIAL_TESTS):
            item.add_marker(pytest.mark.serial)
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: the collection its controller hands out
        rank = {name: i for i, name in enumerate(LONG_FILES)}  # the long files in LONG_FILES's order, then the rest
        items.sort(key=lambda item: rank.get(_file(item), len(LONG_FILES)))  # (stable: the order within is kept)


@pytest.fixture(scope="session")
def cuda_build(tmp_path_factory):
    """The CUDA sources compiled for every architecture, one nvcc call per source (tests/support/cuda_build.py),
    once for this run and kept between runs while the sources, headers, nvcc, host compiler, flags and MegEngine are the
    same (tests/support/build_cache.py); skips where nvcc is missing."""
    if NVCC is None:
        pytest.skip("nvcc not found on PATH: CUDA compile check skipped")
    return build_once(tmp_path_factory, "cuda_build",
                      lambda _: cached_build("cuda_build", cuda_cache_key(), build_cuda, keep=succeeded))


@pytest.fixture
def repo_root():
    return ROOT


@pytest.fixture
def tiny(tmp_path):
    """Path of a tiny experiment file: synthetic 8x8 data, ResNet-20 width 4, 2 epochs (seconds on a CPU)."""
    path = tmp_path / "tiny.py"
    path.write_text(TINY)
    return str(path)


@pytest.fixture
def warnings():
    """Messages (without their newline) logged at WARNING and above during the test."""
    seen = []
    sink = logger.add(lambda m: seen.append(m.record["message"]), level="WARNING")
    yield seen
    logger.remove(sink)
