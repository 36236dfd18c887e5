"""sync_bn_buffers under ``mpiexec -n 2`` / ``-n 3`` with different BN buffers on every rank: "mean" gives every
rank the float64 numpy average of the ranks' buffers, "broadcast" rank 0's, in one collective; FrozenBN
buffers stay each rank's own. One process: nothing happens."""
import pickle

import numpy as np
import pytest

import megengine.module as M

import basebn.distributed as dist
from basebn.layers import BatchNorm2d
from tests.support.mpi_launch import run_mpi
from tests.workers.mpi_bn_buffers_worker import rank_buffers


def test_one_process_is_a_no_op():
    dist.shutdown()
    dist.init("none")
    try:
        model = M.Sequential(BatchNorm2d(2))
        with dist.count_collectives() as counter:
            assert dist.sync_bn_buffers(model) == 0
        assert counter.total == 0
        with pytest.raises(ValueError, match="mode"):
            dist.sync_bn_buffers(model, "median")
    finally:
        dist.shutdown()


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [2, 3])
@pytest.mark.parametrize("mode", ["mean", "broadcast"])
def test_sync_bn_buffers_over_ranks(tmp_path, nprocs, mode):
    run_mpi(nprocs, "-m", "tests.workers.mpi_bn_buffers_worker", tmp_path, mode)
    outs = []
    for r in range(nprocs):
        with open(tmp_path / f"out_{r}.pkl", "rb") as f:
            outs.append(pickle.load(f))
    starts = [rank_buffers(r) for r in range(nprocs)]
    for r, out in enumerate(outs):
        assert out["set"] == 6  # bn, sync, brn: mean and var each
        assert sum(out["collectives"].values()) == 1
        for name in ("bn", "sync", "brn"):
            for i in (0, 1):
                if mode == "mean":
                    want = np.mean([np.float64(s[name][i]) for s in starts], axis=0)
                    np.testing.assert_allclose(out["buffers"][name][i], want, rtol=1e-6, err_msg=name)
                else:
                    np.testing.assert_array_equal(out["buffers"][name][i], starts[0][name][i], err_msg=name)
            # every rank holds the same bits
            np.testing.assert_array_equal(out["buffers"][name][0], outs[0]["buffers"][name][0])
        np.testing.assert_array_equal(out["buffers"]["frozen"][0], starts[r]["frozen"][0])
