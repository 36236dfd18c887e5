"""The float64 reference of a Linear classifier's training: random batches and the mean cross-entropy gradient."""
import numpy as np

N, D, C = 8, 5, 3  # batch, features, classes


def random_batches(steps, seed=0):
    """`steps` (x, y) batches of N float32 rows of D features and int32 labels below C."""
    rng = np.random.RandomState(seed)
    return [(rng.randn(N, D).astype(np.float32), rng.randint(0, C, N).astype(np.int32)) for _ in range(steps)]


def ce_grad(w, b, x, y):
    """d mean-CE / d(W, b) for logits = x W^T + b, in float64."""
    logits = x @ w.T + b
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(len(y)), y] -= 1
    return p.T @ x / len(y), p.sum(0) / len(y)
