"""metrics.jsonl: durable appends, a partial or corrupt line dropped with a warning, truncation on resume."""
import json

from loguru import logger

import pytest

from basebn.engine.metrics_log import append_metrics, foreign_metrics_line, read_metrics, truncate_metrics
from basebn.engine.run_dir import RunDirError


def warnings_of(fn):
    seen = []
    sink = logger.add(lambda m: seen.append(m.record["message"]), level="WARNING")
    try:
        return fn(), seen
    finally:
        logger.remove(sink)


def test_partial_last_line_is_dropped_and_the_next_row_stands_alone(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"epoch": 1, "top1": 10.0}\n{"epoch": 2, "to')  # killed mid-line
    rows, warned = warnings_of(lambda: read_metrics(str(path)))
    assert rows == [{"epoch": 1, "top1": 10.0}]
    assert len(warned) == 1 and ":2: dropped a partial or corrupt line" in warned[0]
    append_metrics(str(path), {"epoch": 2, "top1": 20.0})
    assert path.read_text().splitlines()[-1] == '{"epoch": 2, "top1": 20.0}'
    rows, _ = warnings_of(lambda: read_metrics(str(path)))
    assert rows == [{"epoch": 1, "top1": 10.0}, {"epoch": 2, "top1": 20.0}]


def test_corrupt_lines_of_any_kind_are_dropped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"epoch": 1}\n\xff\xfe\n[1, 2]\n{"top1": 3}\n{"epoch": "2"}\n\n{"epoch": 3}\n')
    rows, warned = warnings_of(lambda: read_metrics(str(path)))
    assert rows == [{"epoch": 1}, {"epoch": 3}] and len(warned) == 4
    assert read_metrics(str(tmp_path / "missing.jsonl")) == []


def row(epoch):
    """A row as basebn's EvalHook writes it: the epoch and evaluate()'s metrics."""
    return {"epoch": epoch, "top1": epoch * 1.5, "top5": 90.0, "loss": 0.5, "images": 37}


def test_truncate_keeps_epochs_the_checkpoint_covers(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(row(e)) + "\n" for e in (1, 2, 3)) + '{"epo')
    kept, _ = warnings_of(lambda: truncate_metrics(str(tmp_path), 2))
    assert kept == [row(1), row(2)]
    assert path.read_text() == json.dumps(row(1)) + "\n" + json.dumps(row(2)) + "\n"
    assert truncate_metrics(str(tmp_path), 0) == [] and path.read_text() == ""
    assert truncate_metrics(str(tmp_path / "none"), 5) == []


@pytest.mark.parametrize("text", [
    "epoch,top1\n1,50.0\n",                                               # a CSV
    '{"epoch": 1, "acc": 0.5}\n{"epoch": 2, "acc": 0.6}\n',               # another tool's JSON lines
    json.dumps(row(1)) + "\n" + '{"step": 100, "loss": 0.3}\n' + json.dumps(row(2)) + "\n",  # mixed in
    json.dumps(row(1)) + "\n\xff\xfe garbage\n",
])
def test_a_metrics_file_basebn_did_not_write_is_refused_and_kept(tmp_path, text):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(text.encode("latin-1") if "\xff" in text else text.encode())
    before = path.read_bytes()
    with pytest.raises(RunDirError, match="was not written by basebn .*move it out of output_dir"):
        truncate_metrics(str(tmp_path), 0)
    assert path.read_bytes() == before


def test_basebn_rows_with_ema_and_cut_off_lines_are_basebns(tmp_path):
    path = tmp_path / "metrics.jsonl"
    ema = dict(row(2), ema_top1=1.0, ema_top5=2.0, ema_loss=3.0)
    cut = json.dumps(row(3))[:25]  # a crash mid-line, then the next run's row on a line of its own
    path.write_text(json.dumps(row(1)) + "\n" + cut + "\n" + json.dumps(ema) + "\n" + '{"ep')
    assert foreign_metrics_line(str(path)) is None
    kept, _ = warnings_of(lambda: truncate_metrics(str(tmp_path), 2))
    assert kept == [row(1), ema]
