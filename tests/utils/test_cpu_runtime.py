"""tune_cpu_runtime: MegEngine reads the capped worker spin, a user's own value wins, and freed blocks stay mapped
(checked with the kernel's minor-fault counter and MegEngine's own log line, not with basebn's code), also after a
plain `import basebn`; lower_event_poller_priority: the kernel reports nice 19 for MegEngine's poller thread and the
inherited value for the others. The processes run with BASEBN_TUNE_CPU=0 (import basebn tunes nothing) unless a test
is about what the import or a CLI applies."""
import os
import subprocess
import sys
import textwrap
import threading

import pytest

from basebn.ops import kernel_library
from basebn.utils.cpu_runtime import (EVENT_POLLER_THREAD, INLINE_OMP_SPIN, TUNE_SWITCH, WORKER_MAX_SPIN,
                                      _lower_poller_once_started, lower_event_poller_priority)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


_SETTINGS_UNDER_TEST = ("MGB_WORKER_MAX_SPIN", "GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "MALLOC_MMAP_MAX_",
                        "GLIBC_TUNABLES")


def _run(code, **env):
    """`code` in a fresh interpreter, without the caller's values of the settings under test, basebn's import
    tuning nothing (unless `env` says otherwise), plus `env`."""
    full = {k: v for k, v in os.environ.items() if k not in _SETTINGS_UNDER_TEST}
    full[TUNE_SWITCH] = "0"
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
        print(tune_cpu_runtime())
    def faults():
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    x = mge.tensor(np.ones((MIB << 18,), np.float32))  # MIB MiB, as a step's activations, allocated by MegEngine
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


def _faults(mode, mib, **env):
    out = _run(_FAULTS.replace("MODE", repr(mode)).replace("MIB", str(mib)), **env)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split()[-1]), out.stdout


# 8 MiB: under glibc's default mmap threshold's ceiling; 40 MiB: over the largest threshold glibc accepts (32 MiB),
# as MobileNetV2's 38.5 MB activation at 112 x 112, batch 32
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
@pytest.mark.parametrize("mib", [8, 40])
def test_megengine_tensors_are_not_faulted_in_again_each_step(mib):
    tensor_pages = (mib << 20) // 4096
    default, _ = _faults("default", mib)
    tuned, printed = _faults("tuned", mib)
    # the default hands blocks back to the kernel and faults them in again (the reason for the setting) ...
    assert default > 3 * tensor_pages, default
    # ... tuned, the freed blocks are reused: not one tensor's worth of fresh pages over ten rounds
    assert tuned < tensor_pages, tuned
    assert "'malloc': True, 'large_blocks_in_heap': True" in printed


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_import_basebn_alone_keeps_freed_blocks_mapped():
    """No call: the script's import of basebn (after megengine's, before its first tensor) applies the setting."""
    tensor_pages = (40 << 20) // 4096
    imported, _ = _faults("import", 40, **{TUNE_SWITCH: "1"})
    assert imported < tensor_pages, imported


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
@pytest.mark.parametrize("env", [dict(MALLOC_MMAP_MAX_="65536"), dict(GLIBC_TUNABLES="glibc.malloc.mmap_max=65536")])
def test_a_users_own_large_block_rule_is_kept(env):
    """glibc reads these at start-up; tune_cpu_runtime leaves large blocks to them (they are mapped, and faulted in
    again each round), and says so."""
    tuned, printed = _faults("tuned", 40, **env)
    assert tuned > 3 * (40 << 20) // 4096, tuned
    assert "'malloc': True, 'large_blocks_in_heap': False" in printed


_INLINE = """
    import numpy as np
    import megengine as mge
    import megengine.functional as F
    from basebn.utils.cpu_runtime import tune_cpu_runtime, use_inline_cpu_device
    tune_cpu_runtime()
    print(use_inline_cpu_device())
    from basebn.ops import bn_ops, kernel_library
    x0 = np.random.default_rng(0).standard_normal((8, 4, 40, 40)).astype(np.float32)
    x = mge.tensor(x0)
    print(x.device.physical_name)
    ok = kernel_library.kernel_available()
    with bn_ops.use_backend("kernel" if ok else "fallback"):
        for _ in range(20):  # a custom op fed straight by MegEngine ops: it must see their results
            mean, m2 = bn_ops.bn_stats(F.exp(x * 0.5) + 1.0)
    ref = np.exp(x0.astype(np.float64) * 0.5) + 1.0
    want_mean = ref.mean(axis=(0, 2, 3))
    want_m2 = ((ref - want_mean[None, :, None, None]) ** 2).sum(axis=(0, 2, 3))
    print(float(np.abs(mean.numpy() - want_mean).max() / np.abs(want_mean).max()),
          float(np.abs(m2.numpy() - want_m2).max() / np.abs(want_m2).max()))
"""


def test_megengine_runs_on_its_inline_cpu_device_and_custom_ops_see_fresh_inputs():
    out = _run(_INLINE)
    assert out.returncode == 0, out.stderr
    tuned, physical, errors = out.stdout.strip().splitlines()[-3:]
    assert tuned == "cpu:default" and physical == "cpu:default"  # MegEngine's own report of the device
    assert max(float(v) for v in errors.split()) < 1e-5, errors


_POLLER = """
    import os
    from basebn.cli import quiet_device_probe
    quiet_device_probe()
    for tid in sorted(os.listdir("/proc/self/task")):
        stat = open(f"/proc/self/task/{tid}/stat").read()
        comm, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        print(comm, rest[16])  # field 19 of proc(5): the nice value, as the kernel keeps it
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")
def test_the_cli_probe_gives_megengines_event_poller_the_lowest_priority():
    out = _run(_POLLER, **{TUNE_SWITCH: "1"})
    assert out.returncode == 0, out.stderr
    nice = [line.rsplit(" ", 1) for line in out.stdout.strip().splitlines()]
    poller = [int(v) for name, v in nice if name == EVENT_POLLER_THREAD]
    others = [int(v) for name, v in nice if name != EVENT_POLLER_THREAD]
    assert poller == [19], out.stdout  # started by the probe's first tensor, then lowered
    assert others and all(v == os.getpriority(os.PRIO_PROCESS, 0) for v in others), out.stdout  # (inherited)


def test_no_poller_thread_or_a_vanished_one_changes_nothing(tmp_path):
    for tid, comm in (("101", "python"), ("999999999", EVENT_POLLER_THREAD)):  # the second thread has ended
        os.makedirs(tmp_path / tid)
        (tmp_path / tid / "comm").write_text(comm + "\n")
    assert lower_event_poller_priority(str(tmp_path)) == []
    assert lower_event_poller_priority(str(tmp_path / "missing")) == []


def test_the_probe_waits_for_a_poller_thread_that_names_itself_late(tmp_path):
    """The poller thread takes its name only once it runs; on a loaded machine that comes after the first tensor's
    result. A real thread of this process stands in for it, its name appearing 50 ms after the probe starts."""
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait, daemon=True)
    worker.start()
    tid = str(worker.native_id)
    os.makedirs(tmp_path / tid)
    named = threading.Timer(0.05, lambda: (tmp_path / tid / "comm").write_text(EVENT_POLLER_THREAD + "\n"))
    try:
        named.start()
        assert lower_event_poller_priority(str(tmp_path)) == []  # one scan now sees no poller
        _lower_poller_once_started(str(tmp_path), wait_s=10)
        with open(f"/proc/self/task/{tid}/stat") as f:
            stat = f.read()
        assert int(stat[stat.rindex(")") + 2:].split()[16]) == 19  # field 19 of proc(5): nice
    finally:
        named.cancel()
        stop.set()


_OMP_SLEEPS = """
    import os
    import numpy as np
    import megengine as mge
    from basebn.utils.cpu_runtime import tune_cpu_runtime, use_inline_cpu_device
    tune_cpu_runtime()
    use_inline_cpu_device(omp_spin=os.environ.pop("TEST_OMP_SPIN") == "1")
    print(os.environ.get("GOMP_SPINCOUNT"), os.environ.get("OMP_WAIT_POLICY"))
    from basebn.ops import bn_ops, kernel_library

    def threads():
        out = {}
        for tid in os.listdir("/proc/self/task"):
            try:
                status = open(f"/proc/self/task/{tid}/status").read().splitlines()
                stat = open(f"/proc/self/task/{tid}/stat").read().rsplit(")", 1)[1].split()
            except FileNotFoundError:
                continue
            out[tid] = (int(stat[11]) + int(stat[12]),
                        int(next(l for l in status if l.startswith("voluntary_ctxt_switches")).split()[1]))
        return out

    assert kernel_library.kernel_available()
    x = mge.tensor(np.random.default_rng(0).standard_normal((8, 64, 56, 56)).astype(np.float32))
    before = threads()
    with bn_ops.use_backend("kernel"):
        for _ in range(10):  # warm-up: the library loads (libgomp reads its settings) and its team starts
            bn_ops.bn_stats(x)[0].numpy()
        started = threads()
        for _ in range(40):
            bn_ops.bn_stats(x)[0].numpy()
    after = threads()
    new = [t for t in started if t not in before and t in after]
    worker = max(new, key=lambda t: after[t][0])  # the OpenMP worker: the busiest thread the kernels started
    print(after[worker][1] - started[worker][1])
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")
@pytest.mark.parametrize("omp_spin, user_policy", [(True, None), (True, "PASSIVE"), (False, None)])
def test_with_the_inline_device_the_openmp_worker_spins_between_ops_unless_told_not_to(omp_spin, user_policy):
    """libgomp's own behaviour, seen in the kernel's count of the OpenMP worker's voluntary sleeps over 40
    two-thread BN ops: with use_inline_cpu_device(omp_spin=True)'s GOMP_SPINCOUNT it spins through the gaps
    between ops (a few sleeps at most); with the user's OMP_WAIT_POLICY=PASSIVE (kept), or without omp_spin (an
    MPI rank's setting), it sleeps after every parallel region (the library's PASSIVE)."""
    if not kernel_library.kernel_available():
        pytest.skip("needs basebn's kernel library")
    env = dict(OMP_NUM_THREADS="2", BASEBN_NUM_THREADS="2", TEST_OMP_SPIN="1" if omp_spin else "0")
    if user_policy:
        env["OMP_WAIT_POLICY"] = user_policy
    # Another process on the cores can only add sleeps (a pre-empted master leaves gaps longer than the spin), never
    # remove them, so the spinning case takes the fewest of up to three runs: a count under 20 cannot come from a
    # sleeping worker, and a loaded host (seen once in a full test run: 166) gets two more chances to be idle.
    counts = []
    for _ in range(3 if omp_spin and not user_policy else 1):
        out = _run(_OMP_SLEEPS, **env)
        assert out.returncode == 0, out.stderr
        settings, sleeps = out.stdout.strip().splitlines()[-2:]
        counts.append(int(sleeps))
        if counts[-1] < 20:
            break
    if omp_spin and not user_policy:
        assert settings == f"{INLINE_OMP_SPIN} None"
        assert min(counts) < 20, counts
    else:
        assert settings == f"None {user_policy}"
        assert counts[0] >= 40
