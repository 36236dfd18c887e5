"""Config schema (defaults.py) and loading with validated overrides (loader.py)."""
from .defaults import DEFAULTS, BaseConfig
from .loader import (RUN_CONFIG, ConfigError, as_recorded, config_class, config_diff, flatten, load_config,
                     parse_overrides, run_dir_of)

__all__ = ["BaseConfig", "DEFAULTS", "ConfigError", "RUN_CONFIG", "load_config", "config_class", "parse_overrides",
           "flatten", "config_diff", "run_dir_of", "as_recorded"]
