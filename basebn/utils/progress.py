"""Progress of a long pass, without tqdm: one bar line redrawn in place on a terminal, plain lines otherwise.

:class:`ProgressDisplay` counts done of total. On a terminal (its stream's ``isatty()``) it redraws one line with
``\\r`` (done/total, percent, elapsed, ETA, rate, a postfix) at most every REDRAW_INTERVAL_S, and ends it with a
newline. Elsewhere (a log file, a pipe) it writes a plain line only after PLAIN_INTERVAL_S without any output
(its own lines or a log line: :class:`LogStream` tells it), and one end line; never a ``\\r``. Only rank 0 shows
anything. :class:`LogStream` is the stderr sink basebn's logging writes through: it clears the bar line before a
log line and redraws it below, so the two never share a line. :func:`progress_bar` wraps an iterable;
:func:`announced_step` logs a start line, a line every HEARTBEAT_S while a slow step (the first kernel build) runs,
and its time at the end.
"""
import atexit
import shutil
import sys
import threading
import time
import weakref
from typing import Any, Callable, Iterable, Optional, TextIO, TypeVar

__all__ = ["ProgressDisplay", "progress_bar", "LogStream", "announced_step", "clear_progress_line",
           "format_seconds", "PLAIN_INTERVAL_S", "REDRAW_INTERVAL_S", "HEARTBEAT_S"]

PLAIN_INTERVAL_S = 10.0
"""Seconds of silence before a plain progress line when the stream is not a terminal."""
REDRAW_INTERVAL_S = 0.1
"""Seconds between redraws of a terminal bar (the last state is always drawn)."""
HEARTBEAT_S = 15.0
"""Seconds between the "still running" lines of :func:`announced_step`."""
_BAR_WIDTH = 20

_lock = threading.RLock()  # one writer at a time: a redraw and a log line from another thread never mix
_drawn = None  # the ProgressDisplay whose bar is on the terminal's last line now, or None
_plain_displays = weakref.WeakSet()  # open displays in plain mode: a log line restarts their timers

T = TypeVar("T")


def format_seconds(seconds: float) -> str:
    """``M:SS``, or ``H:MM:SS`` from an hour on; ``?`` for a value not known (None, negative, infinite)."""
    if seconds is None or not 0 <= seconds < float("inf"):
        return "?"
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def _is_terminal(stream):
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class ProgressDisplay:
    """Done of `total` (None: not known) `unit` of a pass named `desc`, on `stream` (default: sys.stderr now).

    Args:
        total: the count at the end, or None.
        desc: what runs, e.g. "eval epoch 3".
        unit: what is counted, e.g. "batches".
        enabled: False shows nothing (a library call without ``progress=True``).
        rank: this process's rank; only rank 0 shows anything.
        stream: where it writes.
        interval: PLAIN_INTERVAL_S for the plain lines.
        clock: seconds, monotonic (tests drive it).
    """

    def __init__(self, total: Optional[int] = None, desc: str = "", unit: str = "it", *, enabled: bool = True,
                 rank: int = 0, stream: Optional[TextIO] = None, interval: float = PLAIN_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic):
        self.total, self.desc, self.unit, self.done, self.postfix = total, desc, unit, 0, ""
        self.enabled = bool(enabled) and rank == 0
        self.stream = sys.stderr if stream is None else stream
        self.terminal = self.enabled and _is_terminal(self.stream)
        self.interval, self.clock = interval, clock
        self.start = self.last_output = clock()
        self.last_draw = None
        self.width = 0  # characters of the bar line on the terminal now
        self.closed = False
        if self.enabled and not self.terminal:
            _plain_displays.add(self)  # LogStream restarts its timer

    # ------------------------------------------------------------------ counting
    def update(self, n: int = 1, postfix: Optional[str] = None) -> None:
        """Count `n` more done; `postfix` (e.g. "loss 0.41 lr 0.1") replaces the one shown."""
        if not self.enabled or self.closed:
            return
        self.done += n
        if postfix is not None:
            self.postfix = postfix
        now = self.clock()
        if self.terminal:
            if self.last_draw is None or now - self.last_draw >= REDRAW_INTERVAL_S or self.done == self.total:
                self.redraw()
        elif now - self.last_output >= self.interval and self.done != self.total:  # the end line says the rest
            self._write_line(self._plain_text(now, end=False))

    def close(self, completed: bool = True) -> None:
        """End the display: the last state drawn and the line ended (terminal), or the end line (plain). A pass
        that failed (`completed` False) leaves no trace: the bar line is blanked, no end line is written, so the
        error comes on a clean line and last."""
        global _drawn
        if not self.enabled or self.closed:
            return
        self.closed = True
        _plain_displays.discard(self)
        if not completed:
            self.clear()
            return
        with _lock:
            if self.terminal:
                self._draw(self.clock())
                self.stream.write("\n")
                self.stream.flush()
                if _drawn is self:
                    _drawn = None
            else:
                self._write_line(self._plain_text(self.clock(), end=True))

    def __enter__(self) -> "ProgressDisplay":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(completed=exc_type is None)

    # ------------------------------------------------------------------ the terminal line
    def redraw(self) -> None:
        """Draw the bar line again (terminal only)."""
        if self.terminal and not self.closed:
            with _lock:
                self._draw(self.clock())

    def clear(self) -> None:
        """Blank the bar line and put the cursor at its start (terminal only), e.g. before a log line."""
        global _drawn
        if self.terminal and self.width:
            with _lock:
                self.stream.write("\r" + " " * self.width + "\r")
                self.width = 0
                if _drawn is self:
                    _drawn = None

    def noted_output(self) -> None:
        """Another line was just written to the stream: the plain-line timer starts again."""
        self.last_output = self.clock()

    def _draw(self, now):
        global _drawn
        columns = shutil.get_terminal_size((80, 24)).columns - 1  # the last column would wrap on some terminals
        text = self._bar_text(now)[:max(columns, 10)]
        self.stream.write("\r" + text + " " * max(0, self.width - len(text)))
        self.stream.flush()
        self.width, self.last_draw = len(text), now
        _drawn = self

    # ------------------------------------------------------------------ text
    def _rate(self, now):
        elapsed = now - self.start
        return self.done / elapsed if elapsed > 0 and self.done else None

    def _rate_text(self, rate):
        if rate is None:
            return f"? {self.unit}/s"
        return f"{rate:.2f} {self.unit}/s" if rate >= 1 else f"{1 / rate:.2f} s/{self.unit}"

    def _eta(self, now):
        rate = self._rate(now)
        if self.total is None or rate is None:
            return None
        return max(0, self.total - self.done) / rate

    def _bar_text(self, now):
        head = f"{self.desc}: " if self.desc else ""
        rate = self._rate_text(self._rate(now))
        tail = f", {self.postfix}" if self.postfix else ""
        if not self.total:
            return f"{head}{self.done} {self.unit} [{format_seconds(now - self.start)}, {rate}{tail}]"
        frac = min(1.0, self.done / self.total)
        filled = int(frac * _BAR_WIDTH)
        bar = "#" * filled + " " * (_BAR_WIDTH - filled)
        return (f"{head}{100 * frac:3.0f}%|{bar}| {self.done}/{self.total} [{format_seconds(now - self.start)}<"
                f"{format_seconds(self._eta(now))}, {rate}{tail}]")

    def _plain_text(self, now, end):
        head = f"{self.desc}: " if self.desc else ""
        count = f"{self.done}/{self.total} {self.unit}" if self.total else f"{self.done} {self.unit}"
        rate = self._rate_text(self._rate(now))
        tail = f", {self.postfix}" if self.postfix else ""
        if end:
            return f"{head}{count} in {format_seconds(now - self.start)} ({rate}{tail})"
        pct = f" ({100 * self.done / self.total:.0f}%)" if self.total else ""
        eta = f", eta {format_seconds(self._eta(now))}" if self.total else ""
        return f"{head}{count}{pct}, {rate}{eta}{tail}"

    def _write_line(self, text):
        with _lock:
            self.stream.write(text + "\n")
            self.stream.flush()
        self.last_output = self.clock()


def progress_bar(iterable: Iterable[T], desc: str = "", total: Optional[int] = None, enabled: bool = True,
                 unit: str = "batches", rank: int = 0, **display: Any) -> Iterable[T]:
    """`iterable` counted by a :class:`ProgressDisplay` (its end line when the iteration ends; nothing more when it
    stops early or fails), or `iterable` itself when nothing is shown (disabled, or rank != 0). `total` defaults to
    ``len(iterable)`` where it has one; `display`: ProgressDisplay's stream, interval, clock."""
    if not enabled or rank != 0:
        return iterable
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)
    return _counted(iterable, ProgressDisplay(total, desc, unit, **display))


def _counted(iterable, bar):
    with bar:
        for item in iterable:
            yield item
            bar.update(1)


class LogStream:
    """A stream for loguru (``logger.add(LogStream(sys.stderr))``) that keeps a progress bar off log lines: on a
    terminal the bar line is cleared before each message and drawn again below it; elsewhere a message restarts
    the plain-line timer of the display writing to the same stream."""

    def __init__(self, stream: TextIO):
        self.stream = stream

    def write(self, message: str) -> None:
        with _lock:
            bar = _drawn if _drawn is not None and _drawn.stream is self.stream else None
            if bar is not None:
                bar.clear()
            self.stream.write(message)
            self.stream.flush()
            if bar is not None:
                bar.redraw()
        for display in list(_plain_displays):
            if display.stream is self.stream:
                display.noted_output()

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return _is_terminal(self.stream)


def clear_progress_line() -> None:
    """Blank a bar still on the terminal (a pass an error ended before it closed), so what is written next (an
    error line, a traceback, the shell's prompt) starts on a clean line; called by the CLIs' error handling."""
    with _lock:
        if _drawn is not None:
            _drawn.clear()


atexit.register(clear_progress_line)


def announced_step(work: Callable[[], T], what: str, expected: str = "", log: Callable[[str], None] = None,
                   heartbeat_s: float = HEARTBEAT_S, status: Optional[Callable[[], str]] = None) -> T:
    """Run ``work()`` with a line before it (`what`, then `expected`: "first use, ~2 min on 2 cores; ..."), a
    line every `heartbeat_s` while it runs (with ``status()`` when given, e.g. files compiled so far) and a line
    with its time when it ends; returns what it returns. `log`: where the lines go (one string each)."""
    if log is None:
        log = _stderr_line
    log(f"{what} ({expected})" if expected else what)
    start = time.monotonic()
    stop = threading.Event()

    def beat():
        while not stop.wait(heartbeat_s):
            extra = ""
            if status is not None:
                try:
                    extra = f", {status()}"
                except Exception:  # noqa: BLE001 - a status is a nicety: never lets the step fail
                    extra = ""
            log(f"still {what}: {format_seconds(time.monotonic() - start)} so far{extra}")

    thread = threading.Thread(target=beat, name="basebn-heartbeat", daemon=True)
    thread.start()
    ok = False
    try:
        result = work()
        ok = True
        return result
    finally:
        stop.set()
        thread.join()
        elapsed = format_seconds(time.monotonic() - start)
        log(f"finished {what} in {elapsed}" if ok else f"{what} stopped after {elapsed}")


def _stderr_line(text):
    LogStream(sys.stderr).write(text + "\n")
