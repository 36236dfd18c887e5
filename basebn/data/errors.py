"""The exception the data package raises for problems a user can fix (DataError; NoFullBatchError is one kind)."""

__all__ = ["DataError", "NoFullBatchError"]


class DataError(ValueError):
    """A dataset is missing, unreadable, corrupt, or does not fit the model.

    Messages name the offending path or setting and say how to fix it.
    """


class NoFullBatchError(DataError):
    """A training split that gives each process fewer samples (``samples``) than one batch: no full batch per epoch."""

    def __init__(self, message, samples):
        super().__init__(message)
        self.samples = samples
