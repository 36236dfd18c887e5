"""metrics.jsonl: one JSON object per evaluation, appended durably; reading survives a partial last line.

A crash or a full disk can leave a partial line: readers drop it (and any other line that is not a JSON
object with an integer "epoch") with a warning; resume rewrites the file without it (atomically).
"""
import json
import os

from loguru import logger

from ..utils.fs import atomic_write_bytes

__all__ = ["METRICS", "metrics_path", "append_metrics", "read_metrics", "truncate_metrics"]

METRICS = "metrics.jsonl"


def metrics_path(run_dir):
    """RUN_DIR/metrics.jsonl."""
    return os.path.join(run_dir, METRICS)


def append_metrics(path, row):
    """Append `row` as one line, flushed and fsynced (after a partial last line, on a line of its own)."""
    line = json.dumps(row) + "\n"
    with open(path, "a+b") as f:
        f.seek(0, os.SEEK_END)
        if f.tell() > 0:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                line = "\n" + line
        f.write(line.encode())
        f.flush()
        os.fsync(f.fileno())


def read_metrics(path):
    """The rows of a metrics file ([] when it does not exist), without partial or corrupt lines."""
    if not os.path.isfile(path):
        return []
    rows = []
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw.decode("utf-8"))
            except ValueError:
                row = None
            if not isinstance(row, dict) or not isinstance(row.get("epoch"), int):
                logger.warning(f"{path}:{number}: dropped a partial or corrupt line ({raw[:60]!r})")
                continue
            rows.append(row)
    return rows


def truncate_metrics(run_dir, last_epoch):
    """On resume: keep the rows of epochs <= last_epoch (the ones the checkpoint covers); returns them."""
    path = metrics_path(run_dir)
    if not os.path.isfile(path):
        return []
    kept = [row for row in read_metrics(path) if row["epoch"] <= last_epoch]
    atomic_write_bytes(path, "".join(json.dumps(row) + "\n" for row in kept).encode())
    return kept
