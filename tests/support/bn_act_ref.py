"""Float64 numpy transcriptions of the fused BN activations (basebn.ops.bn_ops.ACTIVATIONS) and their
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


# ---- BN [-> add] -> act in float64, and data drawn away from the kinks
def _bs(x):
    return (1, x.shape[1]) + (1,) * (x.ndim - 2)


def _axes(x):
    return (0,) + tuple(range(2, x.ndim))


def ref_pre(x, mean, invstd, w, b, shortcut):
    """BN with the given statistics, then the residual add (float64)."""
    bs = _bs(x)
    pre = (x.astype(np.float64) - mean.reshape(bs)) * (invstd * w).reshape(bs) + b.reshape(bs)
    return pre if shortcut is None else pre + shortcut.astype(np.float64)


def ref_backward(dy, x, mean, invstd, w, pre, act, count):
    """(sum dz, sum dz * xhat, dx, dz) with dz = act'(pre) * dy and the global ``count``."""
    dz = dy.astype(np.float64) * act_grad_ref(pre, act)
    bs = _bs(x)
    xhat = (x.astype(np.float64) - mean.reshape(bs)) * invstd.reshape(bs)
    s1, s2 = dz.sum(axis=_axes(x)), (dz * xhat).sum(axis=_axes(x))
    dx = (w * invstd).reshape(bs) * (dz - s1.reshape(bs) / count - xhat * s2.reshape(bs) / count)
    return s1, s2, dx, dz


def close(got, want, tol, what):
    """got vs the float64 ``want``: relative ``tol``, absolute ``tol`` times max(1, max|want|)."""
    got = got.numpy() if hasattr(got, "numpy") else np.asarray(got)
    scale = max(1.0, float(np.abs(want).max(initial=0.0)))
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol, atol=tol * scale, err_msg=what)


def draw_case(shape, seed, dtype=np.float32, residual=True):
    """x, shortcut, dy, per-channel mean/invstd/w/b (float32 values) with BN + add values spread over
    about [-8, 10] (so ReLU6 clips on both sides, HSwish has all three pieces) and none within 1e-4 of a kink."""
    rng = np.random.default_rng(seed)
    c = shape[1]
    for _ in range(50):
        x = (rng.standard_normal(shape) * 2 + 1).astype(dtype)
        shortcut = rng.standard_normal(shape).astype(dtype) if residual else None
        axes = _axes(x)
        mean = x.astype(np.float64).mean(axis=axes).astype(np.float32)
        invstd = (1.0 / np.sqrt(x.astype(np.float64).var(axis=axes) + 1e-5)).astype(np.float32)
        w = rng.uniform(2.0, 4.0, c).astype(np.float32) * rng.choice([-1, 1], c).astype(np.float32)
        b = rng.uniform(0.0, 2.0, c).astype(np.float32)
        pre = ref_pre(x, mean.astype(np.float64), invstd.astype(np.float64), w, b, shortcut)
        if min_kink_distance(pre) > 1e-4:
            dy = rng.standard_normal(shape).astype(dtype)
            return x, shortcut, dy, mean, invstd, w, b, pre
    raise AssertionError("could not draw data away from the kinks")
