"""metrics.jsonl: one JSON object per evaluation, appended durably; reading survives a partial last line.

A crash or a full disk can leave a partial line: readers drop it (and any other line that is not a JSON
object with an integer "epoch") with a warning; resume rewrites the file without it (atomically).
A file basebn did not write is never rewritten: its rows are objects with an integer "epoch" and numeric
"top1", "top5", "loss" and an integer "images" (what evaluate() returns); a file holding any other complete
line (not a cut-off basebn row) is someone else's, and truncate_metrics refuses it (RunDirError).
"""
import json
import numbers
import os

from loguru import logger

from ..utils.fs import atomic_write_bytes
from .run_dir import RunDirError

__all__ = ["METRICS", "metrics_path", "append_metrics", "read_metrics", "truncate_metrics", "is_basebn_row",
           "foreign_metrics_line", "check_metrics_are_basebns"]

METRICS = "metrics.jsonl"
_ROW_NUMBERS = ("top1", "top5", "loss")
_ROW_START = b'{"epoch": '  # how json.dumps writes every basebn row: a cut-off one starts so too


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


def is_basebn_row(row):
    """`row` has the shape of a row basebn writes: int epoch and images, numeric top1, top5 and loss."""
    def integer(v):
        return isinstance(v, int) and not isinstance(v, bool)

    return (isinstance(row, dict) and integer(row.get("epoch")) and integer(row.get("images")) and all(
        isinstance(row.get(k), numbers.Real) and not isinstance(row.get(k), bool) for k in _ROW_NUMBERS))


def foreign_metrics_line(path):
    """(line number, text) of the first line of `path` that basebn did not write, or None: every line is a
    basebn row, a blank line or a basebn row cut off by a crash or a full disk."""
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            text = raw.strip()
            if not text:
                continue
            try:
                row = json.loads(text.decode("utf-8"))
            except ValueError:
                row = None
                if text.startswith(_ROW_START) or _ROW_START.startswith(text):  # a row of ours, cut off
                    continue
            if not is_basebn_row(row):
                return number, text[:60].decode("utf-8", errors="replace")
    return None


def check_metrics_are_basebns(run_dir):
    """Raise RunDirError when RUN_DIR/metrics.jsonl exists and holds a line basebn did not write."""
    path = metrics_path(run_dir)
    if not os.path.isfile(path):
        return
    foreign = foreign_metrics_line(path)
    if foreign is not None:
        number, text = foreign
        raise RunDirError(f"{path} was not written by basebn (line {number}: {text!r} is not a basebn metrics row); "
                          f"basebn will not rewrite it: move it out of output_dir, or set output_dir=... to another "
                          f"directory")


def truncate_metrics(run_dir, last_epoch):
    """On resume: keep the rows of epochs <= last_epoch (the ones the checkpoint covers); returns them.
    A metrics file basebn did not write is refused (RunDirError) and left as it is."""
    path = metrics_path(run_dir)
    if not os.path.isfile(path):
        return []
    check_metrics_are_basebns(run_dir)
    kept = [row for row in read_metrics(path) if row["epoch"] <= last_epoch]
    atomic_write_bytes(path, "".join(json.dumps(row) + "\n" for row in kept).encode())
    return kept
