"""Load an experiment file or a run's resolved config, apply KEY=VALUE overrides, and check every key against the
schema.

A config is an experiment file (`Cfg` class in a .py file), a run directory (its config.json, the resolved config
basebn.train wrote) or such a config.json itself; a run's config sets output_dir to the run directory.
"""
import ast
import difflib
import importlib.util
import json
import math
import os
from collections.abc import Mapping

from .checks import CheckFailed, check_values
from .defaults import BaseConfig

__all__ = ["ConfigError", "RUN_CONFIG", "as_recorded", "load_config", "parse_overrides", "flatten", "config_diff",
           "run_dir_of", "default_output_dir"]

RUN_CONFIG = "config.json"  # the resolved config in a run directory


class ConfigError(ValueError):
    """A config file or override a user must fix; the message says how."""


def as_recorded(value):
    """`value` as a run's config.json records it (tuples as lists, inf as Infinity, other objects as str), so a
    recorded and a given value compare equal."""
    return json.loads(json.dumps(value, default=str))


def flatten(d, prefix=""):
    """{'a': {'b': 1}} -> {'a.b': 1}"""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _section_hint(key, valid):
    """For a section given a value (`model=resnet50`): its `name` key (model.name) or, without one, its keys."""
    inside = [k for k in valid if k.startswith(key + ".")]
    if not inside:
        return None
    if f"{key}.name" in inside:
        return f"; {key!r} is a section: did you mean '{key}.name'?"
    shown = ", ".join(inside[:6]) + (", ..." if len(inside) > 6 else "")
    return f"; {key!r} is a section: set one of its keys ({shown})"


def _nearest(key, valid):
    section = _section_hint(key, valid)
    if section is not None:
        return section
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    if not close:  # match on the last component, e.g. "max_epochs" -> "solver.max_epoch"
        leaf = {k.rsplit(".", 1)[-1]: k for k in valid}
        hits = difflib.get_close_matches(key.rsplit(".", 1)[-1], list(leaf), n=1, cutoff=0.6)
        close = [leaf[h] for h in hits]
    return f"; did you mean {close[0]!r}?" if close else ""


def _parse_value(text, default):
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        value = text  # bare words are strings: model.name=resnet20
    if isinstance(value, str) and text.lower().lstrip("+-") in ("inf", "infinity", "nan"):
        value = float(text)
    if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    return value


def _check_type(key, value, default):
    if default is None or value is None:
        return
    bad = (isinstance(default, bool) and not isinstance(value, bool)) or (
        isinstance(default, (int, float)) and not isinstance(default, bool)
        and (isinstance(value, bool) or not isinstance(value, (int, float)))
    ) or (isinstance(default, str) and not isinstance(value, str)) or (
        isinstance(default, (tuple, list)) and not isinstance(value, (tuple, list))
    )
    if bad:
        raise ConfigError(
            f"config key {key!r} expects a {type(default).__name__} like {default!r}, got {value!r}"
        )


def check_keys(flat, schema, source):
    """Fail on the first key of flat config `flat` that the schema lacks or whose type differs."""
    for key, value in flat.items():
        if key not in schema:
            # a whole sub-dict given where the schema has one is fine only if its keys are known
            raise ConfigError(f"unknown config key {key!r} in {source}{_nearest(key, list(schema))}")
        _check_type(key, value, schema[key])


def parse_overrides(pairs, schema):
    """['solver.max_epoch=3', ...] -> {'solver.max_epoch': 3}, validated against the flat schema."""
    out = {}
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(f"override {pair!r} is not KEY=VALUE (e.g. solver.max_epoch=3)")
        key, text = pair.split("=", 1)
        key = key.strip()
        if key not in schema:
            raise ConfigError(f"unknown config key {key!r} on the command line{_nearest(key, list(schema))}")
        value = _parse_value(text, schema[key])
        _check_type(key, value, schema[key])
        out[key] = value
    return out


def config_class(path, relative_to=None):
    """The `Cfg` class of config file `path`, so another config can derive from it:

        Base = config_class("fmnist_resnet20.py", relative_to=__file__)
        class Cfg(Base): ...

    A relative `path` is resolved against the folder of the file `relative_to` when it is given (so a
    config finds its base wherever it is run from), else against the working directory.
    """
    if relative_to is not None and not os.path.isabs(path):
        path = os.path.join(os.path.dirname(os.path.abspath(relative_to)), path)
    if not os.path.isfile(path):
        raise ConfigError(f"config file {path!r} does not exist (configs/ holds the shipped ones)")
    spec = importlib.util.spec_from_file_location(f"basebn_cfg_{abs(hash(path))}", path)
    if spec is None:
        raise ConfigError(f"config {path!r} is neither an experiment file (.py), a run directory nor a run's "
                          f"{RUN_CONFIG}")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ConfigError:
        raise
    except Exception as exc:  # the user's file: say which and what broke
        raise ConfigError(f"config file {path!r} failed to load: {type(exc).__name__}: {exc}") from exc
    cls = getattr(module, "Cfg", None)
    if cls is None:
        raise ConfigError(f"config file {path!r} defines no `Cfg` class (class Cfg(BaseConfig): ...)")
    if not (isinstance(cls, type) and issubclass(cls, BaseConfig)):
        raise ConfigError(f"{path}: Cfg must derive from basebn.config.BaseConfig")
    return cls


def _load_file(path):
    cls = config_class(path)
    try:
        return cls()
    except Exception as exc:
        raise ConfigError(f"config file {path!r}: Cfg() failed: {type(exc).__name__}: {exc}") from exc


def _set(cfg, key, value):
    node = cfg
    *parents, leaf = key.split(".")
    for p in parents:
        node = node[p]
    node[leaf] = value


def _run_config_path(spec):
    """RUN_DIR/config.json for a run directory, `spec` itself for a .json file, None for anything else."""
    if not isinstance(spec, str):
        return None
    if os.path.isdir(spec):
        return os.path.join(spec, RUN_CONFIG)
    return spec if spec.lower().endswith(".json") else None


def run_dir_of(spec):
    """The run directory config `spec` names (a run directory, or the folder of a run's config.json), else None."""
    path = _run_config_path(spec)
    return None if path is None else os.path.normpath(os.path.dirname(path) or ".")


def _load_run_config(path, schema):
    """The BaseConfig a run's config.json records (JSON lists back to tuples), its keys checked against `schema`."""
    if not os.path.isfile(path):
        folder = os.path.dirname(path) or "."
        if not os.path.isdir(folder) or os.path.basename(path) != RUN_CONFIG:
            raise ConfigError(f"config {path!r} does not exist")
        raise ConfigError(f"{folder!r} holds no {RUN_CONFIG}, so it is not a run directory: give the experiment "
                          f"file (.py), or a directory basebn.train wrote")
    try:
        with open(path, "rb") as f:
            saved = json.loads(f.read().decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path!r} is not a JSON config ({exc}); give a run's {RUN_CONFIG} or an experiment "
                          f"file") from None
    if not isinstance(saved, dict) or not {"model", "data", "solver"} <= set(saved):
        raise ConfigError(f"{path!r} is not a config basebn.train wrote (a JSON object with model, data and solver)")
    flat = flatten(saved)
    check_keys(flat, schema, path)
    cfg = BaseConfig()
    for key, value in flat.items():
        _set(cfg, key, tuple(value) if isinstance(value, list) else value)
    return cfg


def default_output_dir(path, file_model, model):
    """runs/<config name>, or runs/<config name>-<model> when `model` is not the one the config file names
    (`file_model`), so a run is named after what ran."""
    stem = os.path.splitext(os.path.basename(os.path.normpath(path)))[0]
    return os.path.join("runs", stem if model == file_model else f"{stem}-{model}")


def load_config(path, overrides=()):
    """Return the resolved BaseConfig for config `path` (experiment file, run directory or run's config.json)
    plus KEY=VALUE `overrides`."""
    schema = flatten(BaseConfig())
    run_config = _run_config_path(path)
    if run_config is not None:
        cfg = _load_run_config(run_config, schema)
        cfg.output_dir = run_dir_of(path)
    else:
        cfg = _load_file(path)
        check_keys(flatten(cfg), schema, path)
    file_model = cfg.model.name
    for key, value in parse_overrides(overrides, schema).items():
        _set(cfg, key, value)
    if cfg.output_dir is None:
        cfg.output_dir = default_output_dir(path, file_model, cfg.model.name)
    validate(cfg)
    return cfg


def validate(cfg):
    """Check every value against its rule in checks.RULES; a bad one raises ConfigError naming the key."""
    try:
        check_values(flatten(cfg))
    except CheckFailed as exc:
        raise ConfigError(str(exc)) from None


def config_diff(cfg):
    """Flat {key: value} of what differs from the defaults."""
    base = flatten(BaseConfig())
    return {k: v for k, v in flatten(cfg).items() if k not in base or base[k] != v
            and not (isinstance(v, float) and isinstance(base[k], float) and math.isnan(v) and math.isnan(base[k]))}
