"""The config weights were trained with, and where a given config disagrees with it on what changes results.

A basebn checkpoint records its run's resolved config (key ``config``; a run directory: that of its final, else
latest checkpoint) and a zoo entry names its config and overrides; weights files, exported models and foreign
formats (timm:, basecls:) record none. RESULT_KEYS are the keys that change what a trained model computes on a test
image: its architecture (a different one cannot load the weights), the image size and eval crop, and the
normalisation. Images are always RGB (basecls weights are converted on load), so channel order has no key.
"""

from ..checkpoint import CheckpointError, read_recorded_config, resolve_weights
from ..zoo import ZooError, zoo_config_source
from .loader import ConfigError, as_recorded, flatten, load_config

__all__ = ["RESULT_KEYS", "recorded_config", "config_mismatches", "describe_mismatch", "mismatch_refusal"]

RESULT_KEYS = ("model.name", "model.base_width", "model.stem", "model.stem_stride", "model.norm", "num_classes",
               "data.channels", "data.image_size", "data.crop_pct", "data.interpolation", "data.mean", "data.std",
               "bn.eps")
_ZOO = "zoo:"
_FOREIGN = ("timm:", "basecls:")


def recorded_config(spec):
    """The flat config weights `spec` were trained with, or None when they record none (or cannot be read: loading
    them reports that)."""
    if not isinstance(spec, str) or spec.startswith(_FOREIGN):
        return None
    try:
        if spec.startswith(_ZOO):
            path, overrides = zoo_config_source(spec[len(_ZOO):])
            return flatten(load_config(path, overrides))
        config = read_recorded_config(resolve_weights(spec))
    except (CheckpointError, ConfigError, ZooError):
        return None
    return flatten(config) if isinstance(config, dict) else None


def config_mismatches(given, recorded):
    """[(key, recorded value, given value)] for the RESULT_KEYS where flat config `given` differs from `recorded`
    ([] when recorded is None); a key `recorded` lacks (an older run) is not compared."""
    if recorded is None:
        return []
    return [(key, recorded[key], given.get(key)) for key in RESULT_KEYS
            if key in recorded and as_recorded(recorded[key]) != as_recorded(given.get(key))]


def _value(value):
    return repr(tuple(value) if isinstance(value, list) else value)


def describe_mismatch(source, key, recorded, given):
    """One line: the weights of `source` were trained with key=recorded, the config gives another value."""
    return (f"{source} was trained with {key}={_value(recorded)}, the config gives {key}={_value(given)}: results "
            f"differ from the run's (set {key}={_value(recorded)} to match it)")


def mismatch_refusal(source, mismatches):
    """The one line refusing weights of `source` that do not fit the model the config builds, naming the recorded
    values of the keys in `mismatches` (as config_mismatches gives them)."""
    trained = ", ".join(f"{key}={_value(rec)} (the config gives {_value(giv)})" for key, rec, giv in mismatches)
    fix = " ".join(f"{key}={_value(rec)}" for key, rec, _ in mismatches)
    return (f"{source} does not fit the model this config builds: it was trained with {trained}; give the run "
            f"directory as the config (its config.json has the run's values) or set {fix}")
