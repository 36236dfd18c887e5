"""The automatic self-check of training: no run uses a kernel that disagrees with MegEngine on its machine.

:func:`ensure_kernels_checked` (called where the trainer builds its model) runs the quick form of
:func:`.kernel_selfcheck.run_selfcheck` for the op families the run will use (``bn``: the BN kernels;
``conv``: the oneDNN conv, max-pool and matmul ops, CPU), once per (device name, kernel-library hash): the result
is cached as ``selfcheck-<device>.json`` in the library's build directory (its name is the hash), so later runs only
read it. A family that fails is switched off for this process with ONE warning: ``$BASEBN_BN_BACKEND=fallback``
(the pure-MegEngine BN ops) or ``$BASEBN_CONV_BACKEND=megengine``. ``BASEBN_SELFCHECK=0`` skips the check.
No collective: each process checks its own device (kernel and fallback results agree within tolerance,
so ranks that decide differently still train together).
"""
import json
import os
import re
import tempfile

from loguru import logger

from .bn_ops.backend import requested_backend
from .kernel_library import conv_kernel_available, load_kernels
from .kernel_selfcheck import device_is_gpu, device_name, run_selfcheck

__all__ = ["SELFCHECK_ENV", "selfcheck_cache_path", "ensure_kernels_checked"]

SELFCHECK_ENV = "BASEBN_SELFCHECK"
_FORMAT = 2  # bump when the quick check changes: older cached verdicts are then redone (2: the matmul row)
_FALLBACK = {  # family -> (what, environment variable, value that switches to the MegEngine path, that path)
    "bn": ("the BN kernels", "BASEBN_BN_BACKEND", "fallback", "the pure-MegEngine BN ops"),
    "conv": ("the oneDNN conv, max-pool and matmul ops", "BASEBN_CONV_BACKEND", "megengine",
             "MegEngine's conv, max pool and matmul"),
}
_checked = {}  # (device, build dir) -> {family: verdict dict}, this process


def selfcheck_cache_path(build_dir, device):
    """Where the quick check's verdicts for ``device`` and the library in ``build_dir`` are cached."""
    return os.path.join(build_dir, "selfcheck-" + re.sub(r"[^A-Za-z0-9_.-]+", "_", device).strip("_") + ".json")


def _families_wanted():
    """The op families this process would run on the kernels, if they loaded."""
    try:
        bn_wanted = requested_backend() != "fallback"
    except ValueError:  # a bad $BASEBN_BN_BACKEND: reported by the BN ops themselves
        bn_wanted = False
    conv_req = os.environ.get("BASEBN_CONV_BACKEND", "auto").strip().lower() or "auto"
    conv_wanted = conv_req in ("auto", "dnnl") and not device_is_gpu()
    return [f for f, wanted in (("bn", bn_wanted), ("conv", conv_wanted)) if wanted]


def _families_in_use(lib, wanted):
    """Those of ``wanted`` that the loaded library ``lib`` provides on this device."""
    has = {"bn": lib["cuda"] or not device_is_gpu(), "conv": conv_kernel_available()}
    return [f for f in wanted if has[f]]


def _read(path):
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data.get("families", {}) if data.get("format") == _FORMAT else {}


def _write(path, device, lib, families):
    """Atomically (ranks may write at once); a read-only cache only loses the cache."""
    try:
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".selfcheck-")
        with os.fdopen(fd, "w") as f:
            json.dump({"format": _FORMAT, "device": device, "library": lib["path"], "families": families}, f,
                      indent=1)
        os.replace(tmp, path)
    except OSError as exc:
        logger.debug("basebn self-check: cannot cache the result in {}: {}", path, exc)


def _verdicts(rows, families):
    out = {}
    for family in families:
        mine = [r for r in rows if r.family == family]
        failed = [r for r in mine if r.verdict == "FAIL"]
        out[family] = {"ok": not failed, "failed": [
            f"{r.op}: max rel err {r.max_rel:.2e} > {r.tol:.0e}" + (f" ({r.note})" if r.note else "")
            for r in failed]}
    return out


def _fall_back(bad, device, path):
    parts, switches = [], []
    for family, verdict in bad.items():
        what, env, value, instead = _FALLBACK[family]
        os.environ[env] = value
        parts.append(f"{what} ({'; '.join(verdict['failed'])})")
        switches.append(f"{instead} ({env}={value})")
    logger.warning(
        "basebn self-check: {} disagree with MegEngine on {}; this run uses {} instead (same results, slower). "
        "Please report it to the basebn maintainers with the output of `python -m basebn.tools.selfcheck`. "
        "BASEBN_SELFCHECK=0 skips the check; deleting {} repeats it.",
        " and ".join(parts), device, " and ".join(switches), path)


def ensure_kernels_checked():
    """Check the kernels this process will use (quick form, cached), and switch off a family that disagrees.

    Returns ``{family: {"ok": bool, "failed": [...]}}`` for the families checked (empty when
    ``BASEBN_SELFCHECK=0``, the kernels did not build, or the run uses none of them).
    """
    if os.environ.get(SELFCHECK_ENV, "1").strip() == "0":
        return {}
    wanted = _families_wanted()
    lib = load_kernels() if wanted else None  # (nothing is built for a run that uses no kernel)
    if lib is None:  # the ops fall back (and say why) by themselves
        return {}
    families = _families_in_use(lib, wanted)
    if not families:
        return {}
    device = device_name()
    key = (device, lib["build_dir"])
    path = selfcheck_cache_path(lib["build_dir"], device)
    known = _checked.get(key) or _read(path)
    missing = [f for f in families if f not in known]
    if missing:
        known = dict(known, **_verdicts(run_selfcheck(quick=True, families=missing), missing))
        _write(path, device, lib, known)
        passed = [_FALLBACK[f][0] for f in missing if known[f]["ok"]]
        if passed:
            logger.info("basebn kernels checked on {}: {} agree with MegEngine (verdict cached in {})",
                        device, " and ".join(passed), path)
    _checked[key] = known
    bad = {f: known[f] for f in families if not known[f]["ok"]}
    if bad:
        _fall_back(bad, device, path)
    return {f: known[f] for f in families}
