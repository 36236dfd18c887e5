"""A Ctrl-C or SIGTERM whose exception CPython swallows (the handler ran inside a finalizer: "Exception ignored in")
still ends a basebn CLI with its exit code, once the code reaches basebn.utils.interrupts.raise_pending, as the
trainer does at every iteration. CPython's own behaviour is the reference: without basebn's handlers the same
program prints the ignored exception and goes on to exit 0."""
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import megengine.module as M
import megengine.optimizer as optim
from megengine.autodiff import GradManager

from basebn.engine.losses import CrossEntropyLoss
from basebn.engine.trainer import ClsTrainer
from basebn.utils import interrupts
from tests.support.batches import FixedBatches
from tests.support.signals import default_sigint

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_SWALLOWED = """
    import os, signal, sys
    from basebn.cli import cli_main
    from basebn.utils.interrupts import raise_pending

    class Finalized:
        def __del__(self):  # the signal's Python handler runs in here, so what it raises is printed and dropped
            os.kill(os.getpid(), SIGNAL)
            for _ in range(200000):
                pass

    def main(argv):
        obj = Finalized()
        del obj
        print("went on", flush=True)
        raise_pending()  # what the trainer does at every iteration
        print("not reached", flush=True)
        return 0

    sys.exit((cli_main(main) if WRAPPED else main)([]))
"""


def _run(sig, wrapped):
    code = textwrap.dedent(_SWALLOWED).replace("SIGNAL", f"signal.{sig.name}").replace("WRAPPED", str(wrapped))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env=dict(os.environ, PYTHONPATH=ROOT), preexec_fn=default_sigint)


@pytest.mark.parametrize("sig, code, line", [(signal.SIGINT, 130, "interrupted;"),
                                             (signal.SIGTERM, 143, "terminated (SIGTERM);")])
def test_a_swallowed_interrupt_still_ends_the_cli_with_its_code(sig, code, line):
    out = _run(sig, wrapped=True)
    assert "Exception ignored in" in out.stderr  # CPython did swallow it ...
    assert out.stdout.split() == ["went", "on"]  # ... and the program went on, until raise_pending
    assert out.returncode == code, out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith(line)


def test_without_basebns_handlers_cpython_goes_on_after_a_swallowed_ctrl_c():
    out = _run(signal.SIGINT, wrapped=False)
    assert "Exception ignored in" in out.stderr and "KeyboardInterrupt" in out.stderr
    assert out.stdout.split() == ["went", "on", "not", "reached"]
    assert out.returncode == 0


def test_the_trainer_raises_a_noted_interrupt_before_its_next_step():
    rng = np.random.default_rng(0)
    batches = [(rng.standard_normal((4, 5)).astype(np.float32), rng.integers(0, 3, 4).astype(np.int32))] * 3
    model = M.Linear(5, 3)
    before = model.weight.numpy().copy()
    trainer = ClsTrainer(model, FixedBatches(batches), optim.SGD(model.parameters(), lr=0.1),
                         GradManager().attach(model.parameters()), CrossEntropyLoss(), hooks=[])
    interrupts.note(KeyboardInterrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            trainer.train(start_info=[1, 1], max_info=[1, 3])
    finally:
        interrupts.clear()
    np.testing.assert_array_equal(model.weight.numpy(), before)  # no step was taken


_CUT_WRITE = """
    import io, os, signal, sys
    import numpy as np
    from basebn.checkpoint.format import read_container, write_container
    from basebn.cli import cli_main

    class CutBytesIO(io.BytesIO):
        calls = 0

        def write(self, data):  # SIGTERM arrives while np.savez writes the zip
            CutBytesIO.calls += 1
            if CutBytesIO.calls == 2:
                os.kill(os.getpid(), signal.SIGTERM)
                for _ in range(200000):
                    pass
            return super().write(data)

    def main(argv):
        io.BytesIO = CutBytesIO
        write_container(PATH, {"w": np.arange(100000, dtype=np.float32)}, {"step": 7})
        io.BytesIO = CutBytesIO.__mro__[1]
        print("went on", flush=True)
        return 0

    code = cli_main(main)([])
    arrays, meta, checked = read_container(PATH)
    print("file", checked, meta["step"], float(arrays["w"].sum()), flush=True)
    sys.exit(code)
"""


def test_sigterm_during_a_checkpoint_write_ends_the_run_after_it(tmp_path):
    """SIGTERM while np.savez writes a checkpoint's zip: the write completes (the file reads back whole, checksum
    checked), then the CLI ends with 143 and its one line; no traceback from a half-closed zip writer's finalizer
    (what a scheduler's SIGTERM at checkpoint time printed before)."""
    path = str(tmp_path / "ckpt.npz")
    code = textwrap.dedent(_CUT_WRITE).replace("PATH", repr(path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                         env=dict(os.environ, PYTHONPATH=ROOT))
    assert out.returncode == 143, out.stderr
    assert "Traceback" not in out.stderr and "Exception ignored" not in out.stderr, out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("terminated (SIGTERM);")
    assert "went on" not in out.stdout
    assert out.stdout.split()[-4:] == ["file", "True", "7", str(float(np.arange(100000, dtype=np.float32).sum()))]


def test_a_signal_inside_deferred_is_raised_when_the_block_ends():
    """interrupts.deferred: the handler only notes the interrupt inside the block; the block runs to its end and the
    interrupt is raised after it; a later block without a signal raises nothing; a signal outside any block is
    raised at once, as before."""
    import signal as sig
    import time
    from basebn.cli import _install_signal_handlers
    installed = _install_signal_handlers()
    reached = []
    try:
        with pytest.raises(KeyboardInterrupt):
            with interrupts.deferred():
                os.kill(os.getpid(), sig.SIGTERM)
                time.sleep(0.05)  # the handler has run by now
                reached.append(True)
        assert reached == [True]
        with interrupts.deferred():  # an interrupt noted before the block (above) is not raised by it again
            reached.append(True)
        assert reached == [True, True]
        interrupts.clear()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), sig.SIGTERM)
            time.sleep(0.05)
            reached.append(False)
        assert reached == [True, True]
    finally:
        for s, previous in installed.items():
            sig.signal(s, previous)
        interrupts.clear()
