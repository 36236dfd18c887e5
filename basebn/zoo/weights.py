"""Pickle-free weight files: an .npz (read with allow_pickle=False) holding model/ and ema/ arrays + JSON metadata."""
import hashlib
import io
import json

import numpy as np

from ..engine.checkpoint import atomic_write_bytes

__all__ = ["save_npz_weights", "read_npz_weights", "sha256_of"]

_META = "__meta__"


def sha256_of(path, chunk=1 << 20):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def save_npz_weights(path, model_state, ema_state=None, meta=None):
    arrays = {f"model/{k}": np.asarray(v) for k, v in model_state.items()}
    if ema_state:
        arrays.update({f"ema/{k}": np.asarray(v) for k, v in ema_state.items()})
    arrays[_META] = np.frombuffer(json.dumps(meta or {}).encode(), dtype=np.uint8)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    atomic_write_bytes(path, buf.getvalue())


def read_npz_weights(path):
    """-> (model_state, ema_state or None, meta). Never unpickles."""
    with np.load(path, allow_pickle=False) as z:
        model = {k[6:]: z[k] for k in z.files if k.startswith("model/")}
        ema = {k[4:]: z[k] for k in z.files if k.startswith("ema/")} or None
        meta = json.loads(z[_META].tobytes().decode()) if _META in z.files else {}
    return model, ema, meta
