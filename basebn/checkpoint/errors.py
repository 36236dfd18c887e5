"""CheckpointError: the one exception of the checkpoint package (a user error: the CLIs print it in one line)."""

__all__ = ["CheckpointError"]


class CheckpointError(RuntimeError):
    """A checkpoint or weights file that cannot be used as asked; the message names the file and the problem."""
