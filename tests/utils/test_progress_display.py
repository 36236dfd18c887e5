"""The progress display (basebn/utils/progress.py) and its uses: plain lines off a terminal (counts, no carriage
return, at most one per interval, driven by a fake clock), one bar redrawn in place on a terminal (a fake isatty
stream, read back through a small terminal model), log lines that never share a line with the bar, nothing on a
rank other than 0, and the kernel build's lines before and after a (fake) build."""
import io
import re
import sys
import threading
from types import SimpleNamespace

import numpy as np
import pytest
from loguru import logger

import megengine.module as M

import basebn.engine.evaluate as evaluate_module
import basebn.ops.kernel_library as kernel_library
from basebn.engine.hooks import LoggerHook
from basebn.utils.progress import LogStream, ProgressDisplay, announced_step, clear_progress_line, progress_bar
from tests.support.cli import TINY, metrics, run, write_config


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch):
    """A terminal wide enough for every bar here (the display cuts a line at the terminal's width)."""
    monkeypatch.setenv("COLUMNS", "200")


@pytest.fixture(autouse=True)
def only_the_tests_log_sinks():
    """No loguru sink left by an earlier test in this process (one bound to a stream since closed writes its error to
    whatever sys.stderr is, here the test's terminal); afterwards one sink on the process's stderr (fd 2)."""
    logger.remove()
    yield
    logger.remove()
    logger.add(sys.__stderr__)


class FakeClock:
    """Seconds that move only when the test says so."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self):
        return True


def screen(text):
    """The rows a terminal shows after `text`: '\\r' returns to the row's start, later characters overwrite
    earlier ones, '\\n' starts a new row."""
    rows, row, col = [], [], 0
    for ch in text:
        if ch == "\r":
            col = 0
        elif ch == "\n":
            rows.append("".join(row).rstrip())
            row, col = [], 0
        else:
            if col < len(row):
                row[col] = ch
            else:
                row.append(ch)
            col += 1
    return rows + ["".join(row).rstrip()]


class Timed(io.StringIO):
    """A plain stream that records the clock's time of each line written."""

    def __init__(self, clock):
        super().__init__()
        self.clock, self.times = clock, []

    def write(self, s):
        self.times += [self.clock()] * s.count("\n")
        return super().write(s)


def test_plain_lines_carry_the_counts_at_most_once_per_interval_and_no_carriage_return():
    clock = FakeClock()
    out = Timed(clock)
    bar = ProgressDisplay(100, "eval", "batches", stream=out, interval=10.0, clock=clock)
    for _ in range(200):  # one batch every half second: 200 updates would be 200 lines without the limit
        clock.now += 0.5
        if clock.now.is_integer():
            bar.update(1)
    bar.close()
    text = out.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    # a line after every 10 s (10, 20, ..., 90 batches), none at 100 (the end line says it), then the end line
    etas = {k: f"{(100 - k) // 60}:{(100 - k) % 60:02d}" for k in range(10, 100, 10)}  # one batch a second
    assert lines[:-1] == [f"eval: {k}/100 batches ({k}%), 1.00 batches/s, eta {etas[k]}" for k in range(10, 100, 10)]
    assert lines[-1] == "eval: 100/100 batches in 1:40 (1.00 batches/s)"
    assert all(b - a >= 10.0 for a, b in zip(out.times, out.times[1:-1]))


def test_a_log_line_restarts_the_plain_line_timer():
    """Off a terminal the display fills silence only: a log line written through LogStream counts as output."""
    clock = FakeClock()
    out = io.StringIO()
    bar = ProgressDisplay(30, "epoch 1/2", "iters", stream=out, interval=10.0, clock=clock)
    for k in range(1, 30):
        clock.now = float(k)
        bar.update(1)
        if k % 5 == 0:
            LogStream(out).write(f"log line {k}\n")
    bar.close()
    assert [ln for ln in out.getvalue().splitlines() if not ln.startswith("log line")] == [
        "epoch 1/2: 29/30 iters in 0:29 (1.00 iters/s)"]


def test_terminal_bar_is_redrawn_in_place_and_ends_with_one_newline():
    clock = FakeClock()
    out = Terminal()
    bar = ProgressDisplay(7, "eval", "batches", stream=out, clock=clock)
    for _ in range(7):
        clock.now += 1.0
        bar.update(1, postfix="loss 0.5000")
    bar.close()
    text = out.getvalue()
    assert text.endswith("\n") and text.count("\n") == 1
    drawn = [d for d in text[:-1].split("\r") if d.strip()]
    assert [int(re.search(r" (\d+)/7 ", d).group(1)) for d in drawn][:7] == list(range(1, 8))
    assert screen(text) == ["eval: 100%|####################| 7/7 [0:07<0:00, 1.00 batches/s, loss 0.5000]", ""]


def test_counts_reach_the_total_exactly_however_fast_the_updates_come():
    """With the clock standing still the bar is redrawn rarely, yet its last state is 13/13 in both modes."""
    clock = FakeClock()
    tty, plain = Terminal(), io.StringIO()
    assert list(progress_bar(range(13), "precise BN", stream=tty, clock=clock)) == list(range(13))
    assert list(progress_bar(list(range(13)), "precise BN", stream=plain, clock=clock)) == list(range(13))
    assert re.search(r"\| 13/13 \[", screen(tty.getvalue())[0])
    assert plain.getvalue().splitlines()[-1].startswith("precise BN: 13/13 batches in 0:00")


def test_a_log_line_between_redraws_gets_a_row_of_its_own():
    clock = FakeClock()
    out = Terminal()
    sink = LogStream(out)
    bar = ProgressDisplay(4, "epoch 1/2", "iters", stream=out, clock=clock)
    for k in range(1, 5):
        clock.now = float(k)
        bar.update(1, postfix=f"loss {1 / k:.4f} lr 0.10000")
        if k == 2:
            sink.write("12:00:01 epoch 1/2 iter 2/4 loss 0.7500\n")
    bar.close()
    rows = screen(out.getvalue())
    assert rows[0] == "12:00:01 epoch 1/2 iter 2/4 loss 0.7500"  # no bar characters left on the log row
    assert rows[1].startswith("epoch 1/2: 100%|") and "4/4" in rows[1] and rows[2:] == [""]


def test_training_bar_beside_the_logger_hook_lines(monkeypatch):
    """LoggerHook(progress=True): the epoch's iterations with loss and lr; its log lines land on clean rows."""
    out = Terminal()
    monkeypatch.setattr("sys.stderr", out)
    handler = logger.add(LogStream(out), format="{message}", level="INFO")
    try:
        hook = LoggerHook(every_n_iter=4, progress=True)  # a line every 2 iterations (at least 4 an epoch)
        meters = [dict(loss=1.0 / k, lr=0.1, top1=50.0, data_time=0.0, step_time=0.01, batch=8) for k in range(1, 9)]
        t = SimpleNamespace(iters_per_epoch=8, global_iter=0, meter=None,
                            progress=SimpleNamespace(epoch=1, max_epoch=1, iter=0))
        hook.trainer = t
        hook.before_epoch()
        for k, meter in enumerate(meters, 1):
            t.progress.iter, t.meter, t.global_iter = k, meter, k - 1
            hook.after_iter()
        hook.after_epoch()
    finally:
        logger.remove(handler)
    rows = screen(out.getvalue())
    logged = [r for r in rows if r.startswith("epoch 1/1 iter")]
    assert [r.split(" loss")[0] for r in logged] == [f"epoch 1/1 iter {k}/8" for k in (2, 4, 6, 8)]
    assert all("|" not in r for r in logged)  # no bar fragment on a log row
    bar_rows = [r for r in rows if r.startswith("epoch 1/1: ")]
    assert bar_rows == [bar_rows[-1]] and "8/8" in bar_rows[-1] and "loss 0.1250 lr 0.10000" in bar_rows[-1]


def test_a_pass_an_error_ends_leaves_no_bar_and_no_end_line():
    """The error is what comes last: no end line after it (plain), no bar left on its row (terminal)."""
    def batches():
        yield 1
        yield 2
        raise OSError("disk gone")

    clock = FakeClock()
    for stream in (Terminal(), io.StringIO()):
        with pytest.raises(OSError):
            for _ in progress_bar(batches(), "eval", total=5, stream=stream, clock=clock):
                clock.now += 1.0
        assert screen(stream.getvalue()) == [""]
    out = Terminal()
    bar = ProgressDisplay(5, "epoch 1/2", stream=out, clock=clock)  # a training epoch an error stopped: never closed
    bar.update(1)
    clear_progress_line()  # what the CLIs do before their error line
    assert screen(out.getvalue()) == [""] and "1/5" in out.getvalue()


def test_nothing_is_shown_on_a_rank_other_than_0():
    clock = FakeClock()
    for stream in (Terminal(), io.StringIO()):
        bar = ProgressDisplay(3, "eval", stream=stream, rank=1, clock=clock)
        for _ in range(3):
            clock.now += 20.0
            bar.update(1)
        bar.close()
        batches = [1, 2, 3]
        assert progress_bar(batches, "eval", rank=1, stream=stream) is batches
        assert stream.getvalue() == ""


def _tiny_eval_case():
    model = M.Linear(3, 4)
    rng = np.random.default_rng(0)
    return model, [(rng.normal(size=(5, 3)).astype("float32"), np.arange(5) % 4) for _ in range(3)]


def test_evaluate_shows_batches_only_when_asked_and_only_on_rank_0(capsys, monkeypatch):
    """Library default off; progress=True: the batches done of total on stderr (plain here: not a terminal)."""
    model, loader = _tiny_eval_case()
    evaluate_module.evaluate(model, loader)
    assert capsys.readouterr().err == ""
    evaluate_module.evaluate(model, loader, desc="eval epoch 1", progress=True)
    assert re.fullmatch(r"eval epoch 1: 3/3 batches in 0:00 \(.* batches/s\)\n", capsys.readouterr().err)
    monkeypatch.setattr(evaluate_module.dist, "get_rank", lambda: 1)
    evaluate_module.evaluate(model, loader, progress=True)
    assert capsys.readouterr().err == ""


def test_a_slow_step_says_what_before_and_how_long_after():
    lines = []

    def build():
        lines.append("<build ran>")
        return "lib.so"

    assert announced_step(build, "building basebn's C++ ops", "first use, about 2 min", log=lines.append) == "lib.so"
    assert lines[:2] == ["building basebn's C++ ops (first use, about 2 min)", "<build ran>"]
    assert len(lines) == 3 and re.fullmatch(r"finished building basebn's C\+\+ ops in \d+:\d\d", lines[2])

    lines.clear()

    def failing():
        raise RuntimeError("ninja failed")

    with pytest.raises(RuntimeError, match="ninja failed"):
        announced_step(failing, "building basebn's C++ ops", log=lines.append)
    assert lines[0] == "building basebn's C++ ops" and lines[1].startswith("building basebn's C++ ops stopped after ")


def test_a_slow_step_says_it_is_still_running():
    """The heartbeat line comes while the build runs (the fake build waits for it: no sleep)."""
    lines, beat = [], threading.Event()

    def log(text):
        lines.append(text)
        if text.startswith("still "):
            beat.set()

    def build():
        assert beat.wait(60), "no heartbeat line while the build ran"
        return "lib.so"

    announced_step(build, "building basebn's C++ ops", log=log, heartbeat_s=0.01, status=lambda: "3 of 8 compiled")
    still = [ln for ln in lines if ln.startswith("still ")]
    assert still and re.fullmatch(r"still building basebn's C\+\+ ops: \d+:\d\d so far, 3 of 8 compiled", still[0])
    assert lines[0] == "building basebn's C++ ops" and lines[-1].startswith("finished building basebn's C++ ops in ")


def test_the_kernel_build_announces_itself_once_before_and_once_after(tmp_path, monkeypatch):
    """kernel_library's build site: the compiler (faked: nothing is built) runs between the two lines, and the
    first names what is built, about how long it takes and where it is cached."""
    lines = []
    handler = logger.add(lambda m: lines.append(m.record["message"]), level="INFO")
    spec = SimpleNamespace(sources=("a.cpp", "b.cpp"), build_dir=str(tmp_path), onednn=None, with_cuda=False)

    def fake_compile(s):
        lines.append("<compiler ran>")
        return str(tmp_path / "lib.so")

    monkeypatch.setattr(kernel_library, "_compile", fake_compile)
    try:
        assert kernel_library._announced_compile(spec) == str(tmp_path / "lib.so")
    finally:
        logger.remove(handler)
    assert len(lines) == 3 and lines[1] == "<compiler ran>"
    assert re.fullmatch(rf"building basebn's C\+\+ ops \(the BN ops; first use of this build, about \d+ min on \d+ "
                        rf"core\(s\); cached in {re.escape(str(tmp_path))}\)", lines[0])
    assert re.fullmatch(r"finished building basebn's C\+\+ ops in \d+:\d\d", lines[2])


def test_train_cli_shows_epochs_and_evaluation_as_plain_lines(tmp_path):
    """basebn.train with stderr a pipe: each epoch's iterations and each evaluation end in a count line; no '\\r'."""
    out = str(tmp_path / "run")
    r = run(["basebn.train", write_config(tmp_path, TINY), f"output_dir={out}"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "\r" not in r.stderr
    for epoch in (1, 2):
        assert re.search(rf"^epoch {epoch}/2: 6/6 iters in \d+:\d\d \(", r.stderr, re.M), r.stderr[-3000:]
        assert re.search(rf"^eval epoch {epoch}: 3/3 batches in \d+:\d\d \(", r.stderr, re.M), r.stderr[-3000:]
    assert [m["epoch"] for m in metrics(out)] == [1, 2]
