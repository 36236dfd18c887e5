"""Before `--resume`: is the command's config the one the run was trained with, and are the run's record files
basebn's own?

The run's config is its config.json (written by every start of the run). Keys that change nothing the run
computes (RESUME_FREE_KEYS: where the run and the data are, worker and prefetch counts, logging and epoch-file
frequency) may differ; any other difference is refused unless the caller allows it (`--allow-config-change`).
A config.json or metrics.jsonl that basebn did not write is refused: resume would rewrite it.
"""
import json
import os

from ..config import RUN_CONFIG, BaseConfig, ConfigError, as_recorded, flatten
from .metrics_log import check_metrics_are_basebns
from .run_dir import RunDirError, check_not_in_use

__all__ = ["RESUME_FREE_KEYS", "CONFIG_FILE", "saved_config", "config_changes", "describe_changes", "check_resume"]

CONFIG_FILE = RUN_CONFIG  # the run's resolved config (config/loader.py)
RESUME_FREE_KEYS = ("output_dir", "data.root", "data.num_workers", "data.prefetch", "log_every_n_iter",
                    "save_every_n_epoch")
_SHOWN = 6


def saved_config(run_dir):
    """The flat config of RUN_DIR/config.json, or None when there is none; RunDirError when it exists but is not
    a config basebn wrote."""
    path = os.path.join(run_dir, CONFIG_FILE)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, "rb") as f:
            saved = json.loads(f.read().decode("utf-8"))
    except ValueError:
        saved = None
    if not isinstance(saved, dict) or not {"model", "solver", "data"} <= set(saved):
        raise RunDirError(f"{path} is not a config basebn wrote (not a JSON object with model, data and solver); "
                          f"basebn will not overwrite it: move it out of output_dir, or set output_dir=... to "
                          f"another directory")
    return flatten(saved)


def config_changes(cfg, run_dir):
    """[(key, value in the run, value now)] for every key but RESUME_FREE_KEYS whose value differs from the run's
    config.json ([] when the run has none). A key the run's basebn did not have counts as its default then."""
    old = saved_config(run_dir)
    if old is None:
        return []
    new = flatten(as_recorded(cfg.to_dict()))
    defaults = flatten(as_recorded(BaseConfig().to_dict()))
    changes = []
    for key, value in new.items():
        before = old.get(key, defaults.get(key))
        if key not in RESUME_FREE_KEYS and json.dumps(before) != json.dumps(value):
            changes.append((key, before, value))
    return changes


def describe_changes(changes):
    """'batch_size 16 -> 32, solver.basic_lr 0.1 -> 0.2' (the first few, then how many more)."""
    shown = ", ".join(f"{key} {before!r} -> {value!r}" for key, before, value in changes[:_SHOWN])
    more = len(changes) - _SHOWN
    return shown + (f" and {more} more" if more > 0 else "")


def check_resume(cfg, allow_config_change=False):
    """Refuse `--resume` into cfg.output_dir when a training holds it or its record files are not basebn's
    (RunDirError), or when the config changed (ConfigError, unless allow_config_change); returns the changes
    allowed."""
    run_dir = cfg.output_dir
    if not os.path.isdir(run_dir):
        return []
    check_not_in_use(run_dir)  # a run in progress is the first thing to say
    check_metrics_are_basebns(run_dir)
    changes = config_changes(cfg, run_dir)
    if changes and not allow_config_change:
        raise ConfigError(f"--resume: the config differs from the one the run in {run_dir!r} was trained with "
                          f"({describe_changes(changes)}); run with the run's values, or add --allow-config-change "
                          f"to continue with the new ones (config.json then records them), or --restart to start "
                          f"over")
    return changes
