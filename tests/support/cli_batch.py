"""Several CLI invocations in one subprocess, each through its module's ``main(argv)`` as ``python -m`` runs it.

The interpreter, MegEngine and the kernel library start once instead of once per invocation (seconds each). For
checks of how a CLI ends (its exit code, its stdout and stderr lines), not of state a run leaves in its process:
each call runs in the process the calls before it used, so put one that changes the process (basebn.train makes
MegEngine's inline CPU device the default) last. What the process printed before the first call (imports) belongs
to every call's output, as it would to each of separate processes.
"""
import json
import os
import subprocess

from . import ROOT
from .cli import PY

MARK = "@@basebn-cli-batch-call@@"

DRIVER = f"""
import importlib, json, sys, traceback
codes = []
for module, argv in json.loads(sys.argv[1]):
    for stream in (sys.stdout, sys.stderr):
        print({MARK!r}, file=stream, flush=True)
    try:
        code = importlib.import_module(module).main(argv)
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    except BaseException:  # what `python -m` would print before exiting 1
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    codes.append(code)
print({MARK!r}, json.dumps(codes), flush=True)
"""


def run_mains(calls, env=None, timeout=600):
    """Run ``[(module, argv), ...]`` in order in one subprocess (cwd: the repository root, which is on PYTHONPATH);
    returns one CompletedProcess per call (its exit code, stdout and stderr). AssertionError where the subprocess
    itself failed."""
    env = env or dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([PY, "-c", DRIVER, json.dumps([[module, list(argv)] for module, argv in calls])], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout)
    out = proc.stdout.split(MARK + "\n")
    err = proc.stderr.split(MARK + "\n")
    last = out[-1].rsplit(MARK, 1)
    assert proc.returncode == 0 and len(last) == 2 and len(out) == len(err) == len(calls) + 1, (
        f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    out[-1] = last[0]
    codes = json.loads(last[1])
    return [subprocess.CompletedProcess([module, *argv], code, out[0] + o, err[0] + e)
            for (module, argv), code, o, e in zip(calls, codes, out[1:], err[1:])]
