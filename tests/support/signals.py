"""Child processes that a test interrupts with SIGINT, as a terminal's Ctrl-C would."""
import signal


def default_sigint():
    """``preexec_fn``: the child starts with SIGINT's default action, so Python installs its KeyboardInterrupt
    handler. A shell without job control starts background commands (``make test &`` in a script) with SIGINT
    ignored, children inherit that, and a SIGINT sent to them then does nothing at all."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
