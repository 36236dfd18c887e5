"""What a training checkpoint holds, and restoring it: the one owner of training state.

capture_training_state(trainer) -> payload: model, EMA, optimizer, grad scaler (its numeric attributes),
completed epoch, the run record (best_top1/best_epoch, the last metrics: engine/run_record.py), numpy +
python RNG state and the config. restore_training_state(trainer, payload, source) puts all of it back and
returns the completed epoch. (basebn.checkpoint.model_state is the model-weights part only.)
nonfinite_arrays(payload) names the model/EMA arrays holding a NaN or inf (a checkpoint must hold none).
"""
import random

import numpy as np

import megengine as mge

from ..checkpoint import CheckpointError, load_model_state, model_state

__all__ = ["capture_training_state", "restore_training_state", "nonfinite_arrays", "optimizer_state",
           "load_optimizer_state", "scaler_state", "load_scaler_state"]


def capture_training_state(trainer, epoch=None):
    """The payload of latest/best/epoch_N (epoch: completed epochs, default the current one)."""
    t = trainer
    return {
        "kind": "training",
        "model": model_state(t.model),
        "ema": t.ema.state_dict() if t.ema is not None else None,
        "optimizer": optimizer_state(t.optimizer),
        "scaler": scaler_state(t.grad_scaler),
        "epoch": int(t.progress.epoch if epoch is None else epoch),
        **t.record.state_dict(),  # best_top1, best_epoch, metrics
        "rng": {"numpy": np.random.get_state(), "python": random.getstate()},
        "config": t.cfg.to_dict(),
    }


def nonfinite_arrays(payload):
    """Names (``model/NAME``, ``ema/NAME``) of the floating-point arrays of a :func:`capture_training_state`
    payload's model and EMA that hold a NaN or inf; [] when all are finite."""
    groups = [("model", payload.get("model") or {})]
    if payload.get("ema"):
        groups.append(("ema", payload["ema"].get("module", payload["ema"])))
    return [f"{group}/{name}" for group, arrays in groups for name, a in arrays.items()
            if np.issubdtype(np.asarray(a).dtype, np.floating) and not np.isfinite(a).all()]


def restore_training_state(trainer, ckpt, source="checkpoint"):
    """Load `ckpt` (a capture_training_state payload, or a legacy one) into `trainer`; returns its epoch."""
    t = trainer
    if ckpt.get("optimizer") is None or ckpt.get("rng") is None or "epoch" not in ckpt:
        raise CheckpointError(f"{source} holds no optimizer/progress state (a final or weights-only checkpoint?): "
                              f"--resume needs latest.npz or an epoch_N.npz of the run")
    load_model_state(t.model, ckpt["model"], source=source)
    try:
        load_optimizer_state(t.optimizer, ckpt["optimizer"])
    except (ValueError, KeyError) as exc:
        raise CheckpointError(f"{source}: optimizer state does not fit this run's optimizer ({exc})") from exc
    if t.ema is not None and ckpt.get("ema"):
        t.ema.load_state_dict(ckpt["ema"])
    load_scaler_state(t.grad_scaler, ckpt.get("scaler"))
    t.record.load_state_dict(ckpt)
    np.random.set_state(ckpt["rng"]["numpy"])
    random.setstate(ckpt["rng"]["python"])
    return int(ckpt["epoch"])


def optimizer_state(optimizer):
    """optimizer.state_dict() with numpy arrays in place of tensors."""
    return _to_numpy(optimizer.state_dict())


def load_optimizer_state(optimizer, state):
    """Load a numpy optimizer state (as saved by capture_training_state) into `optimizer`."""
    optimizer.load_state_dict(_to_tensor(state))


def scaler_state(scaler):
    """The numeric attributes of a megengine.amp.GradScaler (scale, growth tracker, ...), or None."""
    if scaler is None:
        return None
    return {k: v for k, v in vars(scaler).items() if isinstance(v, (int, float, bool))}


def load_scaler_state(scaler, state):
    """Set the attributes scaler_state saved (both None: nothing to do; a scaler without state keeps its own)."""
    if scaler is None or not state:
        return
    for key, value in state.items():
        if hasattr(scaler, key):
            setattr(scaler, key, value)


def _to_numpy(obj):
    if isinstance(obj, mge.Tensor):
        return obj.numpy()
    if isinstance(obj, dict):
        return {k: _to_numpy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_numpy(v) for v in obj)
    return obj


def _to_tensor(obj):
    if isinstance(obj, np.ndarray):
        return mge.tensor(obj)
    if isinstance(obj, dict):
        return {k: _to_tensor(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_tensor(v) for v in obj)
    return obj
