"""ExportError: a model, file or option that cannot be exported or run as asked; the message says why.

It derives from ConfigError so that every basebn CLI prints it as one `error: ...` line (exit 2).
"""
from ..config import ConfigError

__all__ = ["ExportError", "DEPLOY_EXTRA_HINT"]

DEPLOY_EXTRA_HINT = 'pip install -e ".[deploy]"'


class ExportError(ConfigError):
    """The model, the exported file or an export option is not usable as asked."""
