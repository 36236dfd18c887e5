"""Shared by the experiment scripts that train over several seeds: the mpiexec to launch multi-process runs with, and
the per-seed summary their results files hold."""
import os
import sys

import numpy as np

__all__ = ["mpiexec", "seed_summary"]


def mpiexec():
    """The mpiexec beside this interpreter (the mpich wheel's in the venv), else the one on PATH."""
    local = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return local if os.access(local, os.X_OK) else "mpiexec"


def seed_summary(values, digits=2):
    """{"mean", "min", "max", "seeds"} of per-seed values (seeds in the order given), rounded to `digits`."""
    v = np.asarray(values, dtype=float)
    return {"mean": round(float(v.mean()), digits), "min": round(float(v.min()), digits),
            "max": round(float(v.max()), digits), "seeds": [round(float(a), digits) for a in v]}
