"""Per-iteration learning-rate schedule with linear warm-up, the warning for a schedule that never reaches its base
lr (a warm-up as long as the run, or a decay that starts long before the warm-up ends), and the warning for BN frozen
in epochs whose lr is still high."""
import bisect
import math
from typing import Any, Optional

__all__ = ["lr_at", "schedule_factor", "peak_factor", "schedule_warning", "PEAK_FRACTION", "frozen_lr_factor",
           "freeze_warning", "FREEZE_LR_FRACTION"]

PEAK_FRACTION = 0.5  # schedule_warning speaks when the highest lr is below this fraction of the base lr
"""schedule_warning speaks when the highest lr is below this fraction of the base lr."""
_PEAK_SAMPLES = 2000  # points of the run at which peak_factor evaluates the schedule
FREEZE_LR_FRACTION = 0.01
"""freeze_warning speaks when the lr of the frozen epochs rises above this fraction of the run's peak lr: training on
frozen BN statistics cost accuracy above it in every schedule measured, and nothing at it (results/bn_freeze.json)."""


def lr_at(it: int, iters_per_epoch: int, solver: Any, base_lr: float) -> float:
    """Learning rate for 0-based global iteration `it`: base_lr * schedule_factor(it / iters_per_epoch, solver).

    Args:
        it: the iteration, 0-based over the whole run.
        iters_per_epoch: iterations per epoch.
        solver: the config's solver section.
        base_lr: the base learning rate.
    """
    return base_lr * schedule_factor(it / iters_per_epoch, solver)


def schedule_factor(t: float, solver: Any) -> float:
    """The lr as a fraction of the base lr at continuous epoch `t` (0-based):
      cosine: min + (1 - min) * (1 + cos(pi * t / max_epoch)) / 2
      linear: min + (1 - min) * (1 - t / max_epoch)
      step:   decay_factor ** (number of decay steps <= t)
    times a warm-up factor rising linearly from warmup_factor to 1 over warmup_epochs.

    Args:
        t: the epoch, continuous, 0-based.
        solver: the config's solver section.

    Raises:
        ValueError: an unknown solver.lr_schedule.
    """
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
    return f


def peak_factor(solver: Any) -> float:
    """The highest lr of the whole run as a fraction of the base lr (the schedule at 2,000 evenly spaced epochs).

    Args:
        solver: the config's solver section.
    """
    return _highest_factor(solver, 0)


def _highest_factor(solver: Any, start: float) -> float:
    """The schedule's highest factor from epoch `start` to the end (2,000 evenly spaced points)."""
    span = solver.max_epoch - start
    return max(schedule_factor(start + span * i / _PEAK_SAMPLES, solver) for i in range(_PEAK_SAMPLES))


def schedule_warning(solver: Any, base_lr: float) -> Optional[str]:
    """One line when the warm-up lasts the whole run (solver.warmup_epochs >= solver.max_epoch, so the lr never
    reaches `base_lr`) or the lr never gets above PEAK_FRACTION of `base_lr`; None for a schedule that does.

    Args:
        solver: the config's solver section.
        base_lr: the base learning rate.
    """
    peak = peak_factor(solver)
    warmup, epochs = solver.warmup_epochs, solver.max_epoch
    shorter = f"solver.warmup_epochs={epochs / 10:g}"
    highest = f"the lr peaks at {base_lr * peak:.3g} ({peak:.0%} of its base {base_lr:.3g})"
    if warmup >= epochs and peak < 1:
        return (f"solver.warmup_epochs={warmup:g} >= solver.max_epoch={epochs}: the warm-up never ends and {highest}; "
                f"shorten the warm-up (e.g. {shorter}) or train longer")
    if peak < PEAK_FRACTION:
        return (f"{highest}: the {solver.lr_schedule} decay of solver.max_epoch={epochs} is far along when the "
                f"warm-up (solver.warmup_epochs={warmup:g}) ends; shorten the warm-up (e.g. {shorter})")
    return None


def frozen_lr_factor(solver: Any, frozen_epochs: int) -> float:
    """The highest lr of the last `frozen_epochs` epochs as a fraction of the base lr (evaluated at 2,000 points).

    Args:
        solver: the config's solver section.
        frozen_epochs: how many epochs at the end of the run.
    """
    return _highest_factor(solver, max(solver.max_epoch - frozen_epochs, 0))


def freeze_warning(solver: Any, freeze_last_epochs: int, base_lr: float) -> Optional[str]:
    """One line when bn.freeze_last_epochs freezes BN in epochs whose lr rises above FREEZE_LR_FRACTION of the
    run's peak lr; None when it is off or the frozen epochs' lr stays at or below it.

    Args:
        solver: the config's solver section.
        freeze_last_epochs: the config's bn.freeze_last_epochs.
        base_lr: the base learning rate.
    """
    if freeze_last_epochs <= 0:
        return None
    peak, frozen = peak_factor(solver), frozen_lr_factor(solver, freeze_last_epochs)
    if frozen <= FREEZE_LR_FRACTION * peak * (1 + 1e-9):
        return None
    return (f"bn.freeze_last_epochs={freeze_last_epochs}: the lr of the frozen epochs reaches {base_lr * frozen:.3g}, "
            f"{frozen / peak:.2g} of the peak {base_lr * peak:.3g}; frozen BN statistics cost accuracy above "
            f"{FREEZE_LR_FRACTION:g} of the peak in every schedule measured (docs/bn_training.md): freeze only "
            f"epochs at most that (e.g. solver.lr_schedule='step' with a last decay step at epoch "
            f"{solver.max_epoch - freeze_last_epochs:g}), or set bn.freeze_last_epochs=0")
