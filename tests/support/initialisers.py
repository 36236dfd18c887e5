"""Building a model without running MegEngine's initialisers: for tests that read only its structure (counts, key
and shape layouts) or replace every value (weights loaded from a file that must hold every key). Its parameters
keep the zeros (and BN's ones) their constructors allocate; initialising a 100 M-parameter model takes seconds.
"""
import contextlib

import pytest

import megengine.module as M

INITIALISERS = ("normal_", "uniform_", "zeros_", "ones_", "fill_", "msra_uniform_", "msra_normal_",
                "xavier_uniform_", "xavier_normal_")
"""The initialisers of megengine.module.init that basebn's models and MegEngine's modules call."""


@contextlib.contextmanager
def initialisers_off():
    """Inside: megengine.module.init's initialisers do nothing; restored on leaving."""
    with pytest.MonkeyPatch.context() as patch:
        for name in INITIALISERS:
            patch.setattr(M.init, name, lambda *a, **k: None)
        yield
