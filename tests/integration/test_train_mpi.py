"""Training and evaluation under mpiexec (CPU multi-process): SyncBN model, exact sample counting."""
import json
import os

import pytest

from tests.support.mpi_launch import run_mpi
from tests.support.cli import TINY as TINY_CLI
from tests.support.cli import metrics, run

pytestmark = pytest.mark.mpi

# the CLI tests' tiny config with SyncBN, batch 8 per rank, one epoch
TINY = TINY_CLI.replace("batch_size=16", "batch_size=8").replace('base_width=4)', 'base_width=4, norm="SyncBN")') \
    .replace("max_epoch=2", "max_epoch=1")



def test_three_ranks_train_and_count_each_test_sample_once(tmp_path):
    cfg = tmp_path / "tiny.py"
    cfg.write_text(TINY)
    run_dir = str(tmp_path / "run")
    run_mpi(3, "-m", "basebn.train", str(cfg), f"output_dir={run_dir}", timeout=400)
    rows = metrics(run_dir)
    assert len(rows) == 1 and rows[0]["images"] == 37  # 37 = 13 + 12 + 12: no padding, no duplicates
    out = run_mpi(3, "-m", "basebn.test", str(cfg), "-w", run_dir, "--json", timeout=400).stdout
    multi = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    single = run(["basebn.test", str(cfg), "-w", run_dir, "--json"])
    assert single.returncode == 0, single.stderr
    single = json.loads(single.stdout.strip().splitlines()[-1])
    assert multi["images"] == single["images"] == 37
    assert multi["top1"] == pytest.approx(single["top1"]) and multi["loss"] == pytest.approx(single["loss"], rel=1e-5)
    assert os.path.isfile(os.path.join(run_dir, "final.npz"))
