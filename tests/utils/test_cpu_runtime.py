"""tune_cpu_runtime: MegEngine reads the capped worker spin, a user's own value wins, and freed blocks stay mapped
(checked with the kernel's minor-fault counter and MegEngine's own log line, not with basebn's code)."""
import os
import subprocess
import sys
import textwrap

import pytest

from basebn.utils.cpu_runtime import WORKER_MAX_SPIN

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(code, **env):
    full = {k: v for k, v in os.environ.items() if k != "MGB_WORKER_MAX_SPIN"}
    full.update(env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=full,
                          cwd=ROOT, timeout=120)


_FIRST_OP = """
    import megengine as mge
    from basebn.utils.cpu_runtime import tune_cpu_runtime
    print(tune_cpu_runtime())
    print(float((mge.tensor([1.0, 2.0]) + 1).sum().numpy()))
"""


def test_megengine_reads_the_capped_spin_at_its_first_operation():
    out = _run(_FIRST_OP)
    assert out.returncode == 0, out.stderr
    assert f"worker would execute with spin of {WORKER_MAX_SPIN}" in out.stderr  # MegEngine's own line
    assert "5.0" in out.stdout


def test_a_spin_set_by_the_user_is_kept():
    out = _run(_FIRST_OP, MGB_WORKER_MAX_SPIN="1234")
    assert out.returncode == 0, out.stderr
    assert "worker would execute with spin of 1234" in out.stderr
    assert "'worker_max_spin': '1234'" in out.stdout


_FAULTS = """
    import resource
    import numpy as np
    import megengine as mge
    from basebn.utils.cpu_runtime import tune_cpu_runtime
    if MODE == "tuned":
        assert tune_cpu_runtime()["malloc"]
    def faults():
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    x = mge.tensor(np.ones((2 << 20,), np.float32))  # 8 MiB, as a step's activations, allocated by MegEngine
    def three_ops():
        y = (x * 2 + 1) * 3  # three 8 MiB results, freed by MegEngine's threads
        del y
        mge._full_sync()
    for _ in range(10):  # the heap grows to its working size
        three_ops()
    before = faults()
    for _ in range(10):
        three_ops()
    print(faults() - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_megengine_tensors_are_not_faulted_in_again_each_step():
    default = _run(_FAULTS.replace("MODE", "'default'"))
    tuned = _run(_FAULTS.replace("MODE", "'tuned'"))
    assert default.returncode == 0 and tuned.returncode == 0, default.stderr + tuned.stderr
    tensor_pages = (8 << 20) // 4096
    # the default hands blocks back to the kernel and faults them in again (the reason for the setting) ...
    assert int(default.stdout) > 3 * tensor_pages, default.stdout
    # ... tuned, the freed blocks are reused: not one tensor's worth of fresh pages over ten rounds
    assert int(tuned.stdout) < tensor_pages, tuned.stdout
