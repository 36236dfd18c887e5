"""The checkpoint files of a run directory: their names, the order they are written in, finding and repairing them.

Epoch end (write_epoch_end): best.npz (when top-1 improved), epoch_N.npz (when kept), then latest.npz LAST:
latest is the commit point, and it records best_top1/best_epoch. A kill between any two writes leaves a
latest.npz of the previous epoch whose best.npz is intact, so --resume redoes the epoch; a kill after the last
epoch's latest.npz (before final.npz) is completed by complete_run. Legacy runs have the same names in .pkl.
"""
import os
import re

from .errors import CheckpointError
from .payload import load_checkpoint, save_checkpoint

__all__ = ["LATEST", "BEST", "FINAL", "LEGACY_SUFFIX", "epoch_file", "epoch_files", "find_checkpoint",
           "resolve_weights", "load_latest", "final_payload", "write_epoch_end", "write_final", "complete_run"]

LATEST, BEST, FINAL = "latest.npz", "best.npz", "final.npz"
LEGACY_SUFFIX = ".pkl"
_EPOCH = re.compile(r"^epoch_(\d+)\.(npz|pkl)$")
_FINAL_KEYS = ("model", "ema", "epoch", "config", "metrics")


def epoch_file(epoch):
    """Name of the checkpoint kept after epoch `epoch` (epoch_N.npz)."""
    return f"epoch_{int(epoch)}.npz"


def epoch_files(run_dir):
    """Names of the epoch_N checkpoints in `run_dir` (.npz and legacy .pkl), newest epoch first."""
    if not os.path.isdir(run_dir):
        return []
    found = [(int(m.group(1)), m.group(2) == "npz", name) for name in os.listdir(run_dir)
             if (m := _EPOCH.match(name))]
    return [name for _, _, name in sorted(found, reverse=True)]


def find_checkpoint(run_dir, name):
    """Path of `name` (e.g. LATEST) in run_dir, else of its legacy .pkl twin, else None."""
    for candidate in (name, name[:-len(".npz")] + LEGACY_SUFFIX):
        path = os.path.join(run_dir, candidate)
        if os.path.isfile(path):
            return path
    return None


def resolve_weights(spec):
    """A checkpoint file, or a run directory (its final checkpoint, else its latest)."""
    if os.path.isdir(spec):
        for name in (FINAL, LATEST):
            path = find_checkpoint(spec, name)
            if path:
                return path
        raise CheckpointError(f"run directory {spec!r} holds neither {FINAL} nor {LATEST}: has the run saved yet?")
    if not os.path.exists(spec):
        raise CheckpointError(f"weights {spec!r} not found: give a checkpoint file, a run directory or zoo:NAME")
    return spec


def load_latest(run_dir, fits=None):
    """(path, payload) of the run's latest checkpoint, or None when it has none; a damaged one names the
    epoch_N files that could replace it. `fits` (model_state.member_fit of the model to resume): a latest.npz
    declaring a member that cannot fit it is refused from its .npy headers, before anything is decompressed."""
    path = find_checkpoint(run_dir, LATEST)
    if path is None:
        return None
    try:
        return path, load_checkpoint(path, fits=fits)
    except CheckpointError as exc:
        spare = epoch_files(run_dir)
        hint = (f"epoch checkpoints that could replace it, newest first: {', '.join(spare)} (copy one over "
                f"{os.path.basename(path)} and --resume again)" if spare else
                "no epoch_N checkpoint is there to replace it: start again without --resume")
        raise CheckpointError(f"{exc}; {hint}") from exc


def final_payload(payload):
    """The final checkpoint's content (weights, EMA, epoch, config, metrics) from a training payload."""
    return {"kind": "final", **{k: payload.get(k) for k in _FINAL_KEYS}}


def write_epoch_end(run_dir, payload, best, keep_epoch):
    """best (if `best`), epoch_N (if `keep_epoch`), then latest: the order that makes every kill recoverable."""
    if best:
        save_checkpoint(os.path.join(run_dir, BEST), payload)
    if keep_epoch:
        save_checkpoint(os.path.join(run_dir, epoch_file(payload["epoch"])), payload)
    save_checkpoint(os.path.join(run_dir, LATEST), payload)


def write_final(run_dir, payload):
    """Write final.npz (weights, EMA, config, last metrics) atomically; returns its path."""
    path = os.path.join(run_dir, FINAL)
    save_checkpoint(path, final_payload(payload))
    return path


def complete_run(run_dir, latest, finished, metrics=None):
    """Write what a kill left missing, given the latest payload: best (when its recorded epoch is not latest's
    best_epoch and the weights are recoverable) and, for a finished run, final. `metrics` stands in for a legacy
    latest without them. Returns one line per file written or not recoverable."""
    done = []
    best_epoch = latest.get("best_epoch")
    if best_epoch is not None and _epoch_of(find_checkpoint(run_dir, BEST)) != best_epoch:
        source = latest if latest.get("epoch") == best_epoch else _load_epoch(run_dir, best_epoch)
        if source is None:
            done.append(f"{BEST} does not hold epoch {best_epoch} and no checkpoint of that epoch is left; "
                        f"best weights not recoverable")
        else:
            save_checkpoint(os.path.join(run_dir, BEST), source)
            done.append(f"{BEST} (epoch {best_epoch})")
    if finished and _epoch_of(os.path.join(run_dir, FINAL)) != latest.get("epoch"):
        payload = latest if "metrics" in latest else {**latest, "metrics": metrics}
        write_final(run_dir, payload)
        done.append(f"{FINAL} (epoch {latest.get('epoch')})")
    return done


def _epoch_of(path):
    if path is None or not os.path.isfile(path):
        return None
    try:
        return load_checkpoint(path).get("epoch")
    except CheckpointError:
        return None


def _load_epoch(run_dir, epoch):
    for name in (epoch_file(epoch), f"epoch_{int(epoch)}{LEGACY_SUFFIX}"):
        path = os.path.join(run_dir, name)
        if _epoch_of(path) == epoch:
            return load_checkpoint(path)
    return None
