"""Config schema (defaults.py) and loading with validated overrides (loader.py)."""
from .defaults import DEFAULTS, BaseConfig
from .loader import ConfigError, config_class, config_diff, flatten, load_config, parse_overrides

__all__ = ["BaseConfig", "DEFAULTS", "ConfigError", "load_config", "config_class", "parse_overrides", "flatten", "config_diff"]
