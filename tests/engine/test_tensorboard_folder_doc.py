"""The comment on log.tensorboard in config/defaults.py (the key's documentation) names the folder the event
files go to: the run directory itself, where default_hooks points the writer."""
import inspect
import os

import basebn.config.defaults as defaults
from basebn.config import BaseConfig
from basebn.engine.hooks import default_hooks
from basebn.engine.run_record import RunRecord
from basebn.engine.tensorboard_hook import TensorBoardHook


def _comment_above(source, key):
    """The comment lines directly above the line assigning `key=` in `source`."""
    lines = source.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith(f"{key}="))
    comment = []
    for line in reversed(lines[:at]):
        if not line.strip().startswith("#"):
            break
        comment.insert(0, line.strip().lstrip("#").strip())
    return " ".join(comment)


def test_the_documented_event_folder_is_where_the_writer_goes(tmp_path):
    run_dir = str(tmp_path / "run")
    hooks = default_hooks(BaseConfig(), 0.1, run_dir, None, None, RunRecord())
    writers = [h for h in hooks if isinstance(h, TensorBoardHook)]
    assert [h.log_dir for h in writers] == [run_dir]
    doc = _comment_above(inspect.getsource(defaults), "tensorboard")
    assert "event files in the run directory" in doc, doc
    assert f"{os.sep}tensorboard" not in doc, doc
