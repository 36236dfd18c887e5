"""What both CLIs share: user errors become one clear line on stderr (exit 2), never a traceback."""
import functools
import sys

from .config import ConfigError
from .data import DataError
from .engine.checkpoint import CheckpointError
from .zoo import ZooError

USER_ERRORS = (ConfigError, DataError, CheckpointError, ZooError)


def user_errors_exit(main):
    @functools.wraps(main)
    def wrapper(argv=None):
        try:
            return main(argv)
        except USER_ERRORS as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2

    return wrapper
