"""Ctrl-C and SIGTERM that always end a run, even when the exception they raise is swallowed.

CPython runs a signal's Python handler between two bytecodes of the main thread. When those belong to a finalizer
(``__del__``, a weakref callback, a generator the garbage collector closes), the exception the handler raises is
printed as "Exception ignored in ..." and the program goes on, so a training run would keep training. The handlers
of :func:`basebn.cli.cli_main` also :func:`note` the exception, and the trainer calls :func:`raise_pending` at every
iteration, which raises it again. Inside :func:`deferred` a handler only notes its exception, raised when the
block ends: a write (a checkpoint's zip) is never cut in the middle.
"""
import contextlib
import threading

__all__ = ["note", "clear", "raise_pending", "interrupt", "deferred"]

_pending = []  # the exception class a signal handler raised, until the process ends or clear()
_deferring = []  # one entry per open deferred() block
_held = []  # the exception class a handler noted inside a deferred() block, raised when the outermost one ends


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


def interrupt(exc_type):
    """What a signal handler does: note ``exc_type`` and raise it, or, inside :func:`deferred`, only note it."""
    note(exc_type)
    if _deferring:
        _held[:] = [exc_type]
    else:
        raise exc_type()


@contextlib.contextmanager
def deferred():
    """Run the block to its end even if Ctrl-C / SIGTERM arrives (the handlers of :func:`basebn.cli.cli_main`
    only note it there), then raise the interrupt that arrived in it (not one noted before the block). np.savez cut
    by one leaves its zip writer open, and the writer's finalizer prints a traceback when the process ends."""
    if threading.current_thread() is not threading.main_thread():  # (handlers run in the main thread only)
        yield
        return
    _deferring.append(True)
    try:
        yield
    finally:
        _deferring.pop()
    if not _deferring and _held:
        raise _held.pop()()
