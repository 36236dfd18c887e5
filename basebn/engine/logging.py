"""loguru set-up: rank 0 logs INFO to stderr and to RUN_DIR/log.txt; other ranks log warnings only."""
import os
import sys

from loguru import logger

from .. import distributed as dist
from ..utils.progress import LogStream


def setup_logging(run_dir=None):
    """Rank 0 logs INFO to stderr (and RUN_DIR/log.txt when run_dir is given); other ranks warnings only. Stderr is
    written through utils/progress.py's LogStream: a progress bar there never shares a line with a log line."""
    logger.remove()
    rank = dist.get_rank()
    fmt = "<green>{time:HH:mm:ss}</green> " + (f"[rank {rank}] " if dist.get_world_size() > 1 else "") + "{message}"
    logger.add(LogStream(sys.stderr), level="INFO" if rank == 0 else "WARNING", format=fmt)
    if run_dir is not None and rank == 0:
        os.makedirs(run_dir, exist_ok=True)
        logger.add(os.path.join(run_dir, "log.txt"), level="INFO", format="{time:YYYY-MM-DD HH:mm:ss} {message}")
