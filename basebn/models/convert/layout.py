"""PyTorch / MegEngine layout differences, and the one check that a converted state fits a model.

Conversions are reshapes only, chosen by the target shape: a (C,) BN weight/bias/running stat or conv
bias to MegEngine's (1, C, 1, 1) (or whatever the model holds), a grouped conv weight (O, I/G, kh, kw)
to MegEngine's (G, O/G, I/G, kh, kw). PyTorch's ``num_batches_tracked`` counters are dropped. Weights
carry no BN momentum: a momentum taken from a PyTorch config (0.1) is MegEngine's 0.9 (1 - m).
"""
import numpy as np

from ...checkpoint import CheckpointError

__all__ = ["fit_state", "reshapeable", "mismatch_report"]

_SHOWN = 5  # keys of each kind named in the error


def reshapeable(src, dst):
    """True when `src` -> `dst` is one of the layout conversions above (not any same-size reshape)."""
    src, dst = tuple(src), tuple(dst)
    if src == dst:
        return True
    if int(np.prod(src)) != int(np.prod(dst)):
        return False
    squeezed = tuple(d for d in dst if d != 1)
    if len(src) == 1 and squeezed in ((), src):  # (C,) -> (1, C, 1, 1)
        return True
    return len(src) == 4 and len(dst) == 5 and dst[0] * dst[1] == src[0] and dst[2:] == src[1:]  # grouped conv


def mismatch_report(missing, unexpected, wrong_shape, source):
    """The CheckpointError message: up to a few keys of each kind, with counts."""
    lines = []
    for what, keys in (("missing in the file", missing), ("not in the model", unexpected),
                       ("wrong shape", wrong_shape)):
        if keys:
            more = f", ... ({len(keys) - _SHOWN} more)" if len(keys) > _SHOWN else ""
            lines.append(f"{what} ({len(keys)}): {', '.join(keys[:_SHOWN])}{more}")
    return (f"{source} does not fit this model after conversion (another architecture or variant?):\n  "
            + "\n  ".join(lines))


def fit_state(state, own_shapes, source, classifier_keys=()):
    """`state` ({key: array}) reshaped to `own_shapes` ({key: shape}); every key and shape checked.

    `classifier_keys` (Linear weights/biases, same layout in both libraries) may keep another shape: a
    classifier for another number of classes, which load_weights(allow_new_head=True) replaces."""
    state = {k: np.asarray(v) for k, v in state.items() if not k.endswith("num_batches_tracked")}
    missing = sorted(set(own_shapes) - set(state))
    unexpected = sorted(set(state) - set(own_shapes))
    kept = {k for k in classifier_keys if k in state and k in own_shapes and state[k].ndim == len(own_shapes[k])}
    wrong = [f"{k} {tuple(state[k].shape)} vs {tuple(own_shapes[k])}" for k in sorted(set(state) & set(own_shapes))
             if k not in kept and not reshapeable(state[k].shape, own_shapes[k])]
    if missing or unexpected or wrong:
        raise CheckpointError(mismatch_report(missing, unexpected, wrong, source))
    shapes = {k: state[k].shape if k in kept else own_shapes[k] for k in state}
    return {k: np.ascontiguousarray(v, dtype=np.float32).reshape(shapes[k]) if v.dtype.kind == "f"
            else v.reshape(shapes[k]) for k, v in state.items()}
