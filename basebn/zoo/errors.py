"""ZooError: a zoo entry that cannot be used (a user error: the CLIs print it in one line)."""

__all__ = ["ZooError"]


class ZooError(RuntimeError):
    """A zoo entry that cannot be used; the message says why and what to do."""
