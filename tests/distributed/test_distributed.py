"""basebn.distributed: the single-process ("none") backend, backend selection, and the MPI backend
under ``mpiexec -n 2`` / ``-n 3`` (skipped with a reason when mpi4py or mpiexec is missing)."""
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

import megengine as mge

import basebn.distributed as dist
from tests.support.mpi_launch import ROOT, run_mpi



@pytest.fixture
def local_dist():
    dist.shutdown()
    assert dist.init("none") == "none"
    yield dist
    dist.shutdown()


def test_import_does_not_import_mpi4py():
    code = "import sys, basebn.distributed as d; assert 'mpi4py' not in sys.modules; " \
           "d.get_rank(); d.all_reduce_sum([1.0]); assert 'mpi4py' not in sys.modules; print(d.backend())"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "OMPI_", "MPI_LOCAL", "MV2_"))}
    env["PYTHONPATH"] = ROOT
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "none"


def test_auto_detection_from_env(monkeypatch):
    for var in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS"):
        monkeypatch.delenv(var, raising=False)
    assert dist.mpi_world_size_from_env() == 0
    assert dist._resolve("auto") == "none"
    monkeypatch.setenv("PMI_SIZE", "1")
    assert dist._resolve("auto") == "none"  # mpiexec -n 1 is a single process
    monkeypatch.setenv("PMI_SIZE", "3")
    assert dist._resolve("auto") == "mpi"
    monkeypatch.delenv("PMI_SIZE")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    assert dist.mpi_world_size_from_env() == 2
    with pytest.raises(ValueError):
        dist._resolve("gloo")


def test_init_is_idempotent_and_refuses_switch(local_dist):
    assert dist.init("auto") == "none"
    assert dist.init("none") == "none"
    with pytest.raises(RuntimeError, match="already initialised"):
        dist.init("mpi")


def test_nccl_requires_megengine_distributed():
    dist.shutdown()
    try:
        with pytest.raises(RuntimeError, match="megengine.distributed"):
            dist.init("nccl")
        assert not dist.is_initialized()
    finally:
        dist.shutdown()


def test_none_backend_primitives(local_dist):
    assert (dist.get_rank(), dist.get_world_size(), dist.is_main_process()) == (0, 1, True)
    dist.barrier()
    t = mge.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    with dist.count_collectives() as c:
        s = dist.all_reduce_sum(t)
        g = dist.all_gather(t)
        b = dist.broadcast(t, src=0)
        n = dist.all_reduce_sum(np.array([1.5, 2.5]))
    assert isinstance(s, mge.Tensor) and s.dtype == t.dtype and s.shape == t.shape
    np.testing.assert_array_equal(s.numpy(), t.numpy())
    assert g.shape == (1, 2, 3)
    np.testing.assert_array_equal(g.numpy()[0], t.numpy())
    np.testing.assert_array_equal(b.numpy(), t.numpy())
    assert isinstance(n, np.ndarray) and n.dtype == np.float64
    assert c.as_dict() == {"all_reduce_sum": 2, "all_gather": 1, "broadcast": 1} and c.total == 4
    with pytest.raises(ValueError):
        dist.broadcast(t, src=1)


def test_counter_freezes_on_exit(local_dist):
    before = dist.collective_count()
    with dist.count_collectives() as c:
        dist.all_reduce_sum(np.zeros(2))
    dist.all_gather(np.zeros(2))
    assert c.total == 1
    assert dist.collective_count() == before + 2
    assert dist.collective_count("all_gather") >= 1


def test_numpy_input_copy_not_alias(local_dist):
    a = np.ones(3)
    out = dist.all_reduce_sum(a)
    out += 1
    np.testing.assert_array_equal(a, np.ones(3))


# ------------------------------------------------------------------------------- under MPI
@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [2, 3])
def test_mpi_primitives(tmp_path, nprocs):
    run_mpi(nprocs, "-m", "tests.workers.mpi_dist_worker", tmp_path)
    res = []
    for r in range(nprocs):
        with open(tmp_path / f"out_{r}.pkl", "rb") as f:
            res.append(pickle.load(f))
    ranks = range(nprocs)
    for r, out in enumerate(res):
        assert out["mpi4py_before_init"] is False
        assert out["backend"] == "mpi" and out["init_again"] == "mpi" and out["mpi4py_after_init"]
        assert (out["rank"], out["world"], out["main"]) == (r, nprocs, r == 0)

        kind, val, dtype, shape = out["ar_f32"]
        assert kind == "Tensor" and dtype == "float32" and shape == (2, 3)
        want = sum((np.arange(6, dtype=np.float32) + 10 * k).reshape(2, 3) for k in ranks)
        np.testing.assert_array_equal(val, want)

        val, dtype = out["ar_i32"]
        assert dtype == "int32"
        np.testing.assert_array_equal(val, [sum(k + 1 for k in ranks), sum(2 * k for k in ranks)])

        kind, val, dtype = out["ar_np64"]
        assert kind == "ndarray" and dtype == np.dtype(np.float64).str
        want = [sum(0.1 * (k + 1) for k in ranks), sum(1.0 + 1e-12 * (k + 1) for k in ranks)]
        np.testing.assert_allclose(val, want, rtol=1e-15)  # float32 anywhere would lose the 1e-12s

        val, dtype = out["ar_np16"]
        assert dtype == np.dtype(np.float16).str
        np.testing.assert_array_equal(val, np.array([0.5 * nprocs, sum(ranks)], dtype=np.float16))

        val, shape = out["ag"]
        assert shape == (nprocs, 2, 2)
        for k in ranks:
            np.testing.assert_array_equal(val[k], np.full((2, 2), k))
        np.testing.assert_array_equal(out["ag_scalar"], [k + 0.5 for k in ranks])

        np.testing.assert_array_equal(out["bc"], np.arange(3, dtype=np.float32) * nprocs)
        assert out["bc_np"].dtype == np.int64
        np.testing.assert_array_equal(out["bc_np"], [0, 0])

        assert out["counts"] == {"all_reduce_sum": 4, "all_gather": 2, "broadcast": 2}
