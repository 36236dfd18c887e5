"""ZooError: a zoo entry that cannot be used (a user error: the CLIs print it in one line); DownloadError."""

__all__ = ["ZooError", "DownloadError"]


class ZooError(RuntimeError):
    """A zoo entry that cannot be used; the message says why and what to do."""


class DownloadError(ZooError):
    """A download that failed or was refused; nothing was cached. `network` is True when the server could not be
    reached or stopped answering (a mirror may help), False when what arrived was refused or the cache is unusable."""

    def __init__(self, message, network=False):
        super().__init__(message)
        self.network = network
