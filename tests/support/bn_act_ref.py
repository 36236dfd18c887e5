"""Float64 numpy transcriptions of the fused BN activations (basebn.layers.bn_ops.ACTIVATIONS) and their
derivatives, for the fused BN-activation tests. The derivatives hold away from the kinks (ReLU: 0; ReLU6: 0, 6;
HSwish: -3, 3), where tests keep their data (``KINKS``)."""
import numpy as np

KINKS = (0.0, 6.0, -3.0, 3.0)


def _sigmoid(v):
    return 0.5 * (1.0 + np.tanh(0.5 * v))  # (no overflow warning for large |v|)


def act_ref(pre, act):
    """``act(pre)``: identity, relu, relu6, silu (pre * sigmoid(pre)), hswish (pre * relu6(pre + 3) / 6)."""
    pre = np.asarray(pre, np.float64)
    if act == "silu":
        return pre * _sigmoid(pre)
    if act == "hswish":
        return pre * np.clip(pre + 3.0, 0.0, 6.0) / 6.0
    return {"identity": pre, "relu": np.maximum(pre, 0.0), "relu6": np.clip(pre, 0.0, 6.0)}[act]


def act_grad_ref(pre, act):
    """``d act / d pre`` (away from the kinks)."""
    pre = np.asarray(pre, np.float64)
    if act == "silu":
        s = _sigmoid(pre)
        return s * (1.0 + pre * (1.0 - s))
    if act == "hswish":
        return np.where(pre < -3, 0.0, np.where(pre > 3, 1.0, (2.0 * pre + 3.0) / 6.0))
    return {"identity": np.ones_like(pre), "relu": (pre > 0).astype(np.float64),
            "relu6": ((pre > 0) & (pre < 6)).astype(np.float64)}[act]


def min_kink_distance(pre):
    """The smallest distance of a value of ``pre`` to any activation's kink."""
    return min(float(np.abs(np.asarray(pre, np.float64) - k).min(initial=np.inf)) for k in KINKS)
