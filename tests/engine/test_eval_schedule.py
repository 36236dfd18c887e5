"""eval_every_n_epoch: every N epochs and always after the last; inf = after the last only (defaults.py)."""
import pytest

from tests.support.cli import metrics, run


@pytest.mark.parametrize("every, epochs", [("inf", [3]), ("2", [2, 3]), ("1", [1, 2, 3])])
def test_evaluated_epochs(tiny, tmp_path, every, epochs):
    run_dir = str(tmp_path / "run")
    r = run(["basebn.train", tiny, f"output_dir={run_dir}", "solver.max_epoch=3", f"eval_every_n_epoch={every}"])
    assert r.returncode == 0, r.stderr
    assert [row["epoch"] for row in metrics(run_dir)] == epochs
