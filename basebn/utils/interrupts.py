"""Ctrl-C and SIGTERM that always end a run, even when the exception they raise is swallowed.

CPython runs a signal's Python handler between two bytecodes of the main thread. When those belong to a finalizer
(``__del__``, a weakref callback, a generator the garbage collector closes), the exception the handler raises is
printed as "Exception ignored in ..." and the program goes on, so a training run would keep training. The handlers
of :func:`basebn.cli.cli_main` also :func:`note` the exception, and the trainer calls :func:`raise_pending` at every
iteration, which raises it again.
"""

__all__ = ["note", "clear", "raise_pending"]

_pending = []  # the exception class a signal handler raised, until the process ends or clear()


def note(exc_type):
    """Remember that a signal handler raised ``exc_type`` (a KeyboardInterrupt subclass)."""
    _pending[:] = [exc_type]


def clear():
    """Forget a noted interrupt (a CLI entry point starting, or ending after handling it)."""
    _pending.clear()


def raise_pending():
    """Raise the noted interrupt again, if there is one: a no-op unless a Ctrl-C / SIGTERM arrived."""
    if _pending:
        raise _pending[0]()
