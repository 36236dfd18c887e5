"""metrics.jsonl: durable appends, a partial or corrupt line dropped with a warning, truncation on resume."""
import json

from loguru import logger

from basebn.engine.metrics_log import append_metrics, read_metrics, truncate_metrics


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


def test_truncate_keeps_epochs_the_checkpoint_covers(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"epoch": e, "top1": e * 1.5}) + "\n" for e in (1, 2, 3)) + '{"epo')
    kept, _ = warnings_of(lambda: truncate_metrics(str(tmp_path), 2))
    assert kept == [{"epoch": 1, "top1": 1.5}, {"epoch": 2, "top1": 3.0}]
    assert path.read_text() == '{"epoch": 1, "top1": 1.5}\n{"epoch": 2, "top1": 3.0}\n'
    assert truncate_metrics(str(tmp_path), 0) == [] and path.read_text() == ""
    assert truncate_metrics(str(tmp_path / "none"), 5) == []
