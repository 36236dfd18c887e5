"""A tqdm progress bar when asked for and stderr is a terminal (tqdm is optional), else the iterable itself."""
import sys

__all__ = ["progress_bar"]


def progress_bar(iterable, desc="", total=None, enabled=True):
    """Wrap `iterable` in a transient bar; callers pass enabled=is_main_process() so one rank draws it."""
    if not enabled or not sys.stderr.isatty():
        return iterable
    try:
        from tqdm import tqdm  # optional dependency
    except ImportError:
        return iterable
    return tqdm(iterable, desc=desc, total=total, leave=False, dynamic_ncols=True)
