"""A progress bar on the main process only (tqdm to stderr); other ranks iterate silently."""
import sys

from .. import distributed as dist

__all__ = ["progress_bar"]


def progress_bar(iterable, desc="", total=None):
    if not dist.is_main_process() or not sys.stderr.isatty():
        return iterable
    from tqdm import tqdm

    return tqdm(iterable, desc=desc, total=total, leave=False, dynamic_ncols=True)
