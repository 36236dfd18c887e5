"""Per-iteration learning-rate schedule with linear warm-up."""
import bisect
import math

__all__ = ["lr_at"]


def lr_at(it, iters_per_epoch, solver, base_lr):
    """Learning rate for 0-based global iteration `it`.

    The schedule runs on the continuous epoch t = it / iters_per_epoch:
      cosine: min + (1 - min) * (1 + cos(pi * t / max_epoch)) / 2
      linear: min + (1 - min) * (1 - t / max_epoch)
      step:   decay_factor ** (number of decay steps <= t)
    times a warm-up factor rising linearly from warmup_factor to 1 over warmup_epochs.
    """
    t = it / iters_per_epoch
    if solver.lr_schedule == "cosine":
        f = solver.lr_min_factor + (1 - solver.lr_min_factor) * 0.5 * (1 + math.cos(math.pi * t / solver.max_epoch))
    elif solver.lr_schedule == "linear":
        f = solver.lr_min_factor + (1 - solver.lr_min_factor) * (1 - t / solver.max_epoch)
    elif solver.lr_schedule == "step":
        f = solver.lr_decay_factor ** bisect.bisect_right(list(solver.lr_decay_steps), t)
    else:
        raise ValueError(f"unknown solver.lr_schedule {solver.lr_schedule!r}: use cosine, step or linear")
    if t < solver.warmup_epochs:
        alpha = t / solver.warmup_epochs
        f *= solver.warmup_factor * (1 - alpha) + alpha
    return base_lr * f
