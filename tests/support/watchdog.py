"""A watchdog fixture against hangs."""
import signal

import pytest


def watchdog(seconds, make_error):
    """An autouse fixture that raises make_error() in the test after `seconds` (SIGALRM), so a hang fails the
    test instead of blocking the suite."""
    @pytest.fixture(autouse=True)
    def alarm():
        def hung(signum, frame):
            raise make_error()
        previous = signal.signal(signal.SIGALRM, hung)
        signal.alarm(seconds)
        yield
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    return alarm
