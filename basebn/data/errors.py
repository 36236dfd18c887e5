"""The one exception type the data package raises for problems a user can fix."""

__all__ = ["DataError"]


class DataError(ValueError):
    """A dataset is missing, unreadable, corrupt, or does not fit the model.

    Messages name the offending path or setting and say how to fix it.
    """
