"""A library script (`import basebn`, a model, one SGD step in a plain MegEngine loop) gets what the CLIs give their
process: no MegEngine CUDA banner or `failed to load cuda func` lines, the capped worker spin, the event poller at
nice 19, and with basebn.setup_cpu_training() basebn.train's inline device and OpenMP spin. The reference values are
docs/setup.md's (MGB_WORKER_MAX_SPIN=30000, nice 19, cpu:default, GOMP_SPINCOUNT=30000), read back from the
process: the environment, the kernel's nice value of the poller thread, MegEngine's report of a tensor's device."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_SETTINGS = ("MGB_WORKER_MAX_SPIN", "GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "MALLOC_MMAP_MAX_", "GLIBC_TUNABLES",
             "BASEBN_TUNE_CPU")
_NOISE = ("failed to load cuda func", "MegEngine works under CPU mode", "worker would execute with spin")

_LIBRARY_SCRIPT = """
    import json, os
    import numpy as np
    import megengine as mge
    import megengine.functional as F
    import megengine.optimizer as optim
    from megengine.autodiff import GradManager
    import basebn
    if SETUP:
        basebn.setup_cpu_training()
    model = basebn.models.build_model("resnet20", num_classes=10, in_channels=1, base_width=4)
    gm = GradManager().attach(model.parameters())
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = mge.tensor(np.random.default_rng(0).standard_normal((8, 1, 12, 12)).astype(np.float32))
    y = mge.tensor(np.arange(8, dtype=np.int32))
    with gm:
        loss = F.nn.cross_entropy(model(x), y)
        gm.backward(loss)
    opt.step().clear_grad()
    poller = []
    for tid in os.listdir("/proc/self/task"):
        stat = open(f"/proc/self/task/{tid}/stat").read()
        if stat[stat.index("(") + 1:stat.rindex(")")] == "CompNodeSync":
            poller.append(int(stat[stat.rindex(")") + 2:].split()[16]))  # field 19 of proc(5): nice
    print("@@" + json.dumps(dict(loss=float(loss.item()), poller_nice=poller, device=x.device.physical_name,
                                 env={k: os.environ.get(k) for k in ("MGB_WORKER_MAX_SPIN", "GOMP_SPINCOUNT")})))
"""


def _run(code, **env):
    full = {k: v for k, v in os.environ.items() if k not in _SETTINGS}
    full.update(env, PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=full,
                         cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    return out


def _state(out):
    return json.loads(next(line[2:] for line in out.stdout.splitlines() if line.startswith("@@")))


needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")


@needs_proc
@pytest.mark.parametrize("setup", [True, False])
def test_a_library_script_is_quiet_and_gets_the_clis_settings(setup):
    out = _run(_LIBRARY_SCRIPT.replace("SETUP", str(setup)))
    state = _state(out)
    assert [line for line in out.stderr.splitlines() if any(n in line for n in _NOISE)] == [], out.stderr
    assert "info: +" not in out.stderr, out.stderr  # the banner's lines
    assert state["loss"] == state["loss"] and state["loss"] > 0  # the step ran (finite, positive cross-entropy)
    assert state["env"]["MGB_WORKER_MAX_SPIN"] == "30000"
    assert state["poller_nice"] == [19]
    if setup:  # basebn.train's device and OpenMP spin
        assert state["device"] == "cpu:default"
        assert state["env"]["GOMP_SPINCOUNT"] == "30000"
    else:  # MegEngine's own device, no OpenMP spin: safe to trace and dump
        assert state["device"] == "cpu0:0"
        assert state["env"]["GOMP_SPINCOUNT"] is None


@needs_proc
def test_basebn_tune_cpu_0_leaves_the_process_as_megengine_sets_it_up():
    out = _run(_LIBRARY_SCRIPT.replace("SETUP", "False"), BASEBN_TUNE_CPU="0")
    state = _state(out)
    assert state["env"]["MGB_WORKER_MAX_SPIN"] is None
    assert state["poller_nice"] == [os.getpriority(os.PRIO_PROCESS, 0)]  # inherited from this process
    assert "failed to load cuda func" in out.stderr  # MegEngine's own probe, not silenced either


_OP_FIRST = """
    import megengine.functional as F
    F.ones((2,)).numpy()  # MegEngine has read its worker spin
    import basebn
    import os
    print("@@" + os.environ.get("MGB_WORKER_MAX_SPIN", "unset"))
"""
_IMPORT_FIRST = """
    import megengine
    import basebn
    import os
    print("@@" + os.environ.get("MGB_WORKER_MAX_SPIN", "unset"))
"""


@needs_proc
def test_an_operation_before_import_basebn_gets_one_warning_with_the_fix():
    warned = _run(_OP_FIRST).stderr
    assert warned.count("RuntimeWarning") == 1, warned
    assert "import basebn before the first tensor" in warned and "MGB_WORKER_MAX_SPIN=30000" in warned
    assert "RuntimeWarning" not in _run(_OP_FIRST, MGB_WORKER_MAX_SPIN="5000").stderr  # the user chose a spin
    imported = _run(_IMPORT_FIRST)  # megengine imported first, no operation yet: nothing is too late
    assert "RuntimeWarning" not in imported.stderr and "failed to load cuda func" not in imported.stderr
    assert "@@30000" in imported.stdout


def test_import_basebn_gives_its_subpackages():
    out = _run("""
        import basebn
        print("@@" + " ".join(m.__name__ for m in (basebn.models, basebn.layers, basebn.engine.ema,
              basebn.engine.adapt, basebn.distributed.bn_buffers, basebn.layers.precise_bn, basebn.data,
              basebn.config, basebn.checkpoint, basebn.deploy, basebn.zoo, basebn.utils)))
    """)
    assert out.stdout.split("@@")[1].split() == [
        "basebn.models", "basebn.layers", "basebn.engine.ema", "basebn.engine.adapt", "basebn.distributed.bn_buffers",
        "basebn.layers.precise_bn", "basebn.data", "basebn.config", "basebn.checkpoint", "basebn.deploy",
        "basebn.zoo", "basebn.utils"]
