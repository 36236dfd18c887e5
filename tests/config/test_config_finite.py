"""No config key takes nan, and none takes inf or -inf except where the defaults document it as 'off' or 'no limit':
every key of the schema is tried (a number, and lists of numbers holding one), so a key added later is covered."""
import copy
import math

import pytest

from basebn.config import BaseConfig, ConfigError, load_config
from basebn.config.loader import flatten, validate
from tests.support.cli import TINY, write_config

SCHEMA = flatten(BaseConfig())
# where the defaults say what an infinity means: no clipping, off, never
INFINITY_MEANS = {"solver.grad_clip.max_norm": (math.inf,), "solver.grad_clip.lower": (-math.inf,),
                  "solver.grad_clip.upper": (math.inf,), "bn.precise_every_n_epoch": (math.inf,),
                  "save_every_n_epoch": (math.inf,), "eval_every_n_epoch": (math.inf,)}


@pytest.fixture(scope="module")
def good_cfg(tmp_path_factory):
    return load_config(write_config(tmp_path_factory.mktemp("cfg"), TINY))


def _with(cfg, key, value):
    out = copy.deepcopy(cfg)
    node = out
    *parents, leaf = key.split(".")
    for p in parents:
        node = node[p]
    node[leaf] = value
    return out


def _refused(cfg, key, value):
    try:
        validate(_with(cfg, key, value))
    except ConfigError as exc:
        assert repr(key) in str(exc) or key in str(exc), (key, str(exc))
        return True
    return False


def _values(special):
    """`special` alone and in lists of one to three numbers (config lists: mean/std, ranges, betas, steps)."""
    return [special, *([special] * n for n in (1, 2, 3)), [1.0, special], [0.5, 0.5, special]]


@pytest.mark.parametrize("key", sorted(SCHEMA))
def test_no_key_takes_nan(good_cfg, key):
    for value in _values(math.nan):
        assert _refused(good_cfg, key, value), f"config key {key!r} accepts {value!r}"


@pytest.mark.parametrize("key", sorted(SCHEMA))
def test_no_key_takes_an_infinity_unless_it_means_off(good_cfg, key):
    for special in (math.inf, -math.inf):
        for value in _values(special):
            if value in INFINITY_MEANS.get(key, ()):
                assert not _refused(good_cfg, key, value), f"config key {key!r} refuses its documented {value!r}"
            else:
                assert _refused(good_cfg, key, value), f"config key {key!r} accepts {value!r}"


@pytest.mark.parametrize("override", ["solver.basic_lr=nan", "bn.momentum=nan", "model_ema.momentum=inf",
                                      "solver.grad_clip.max_norm=nan"])
def test_a_non_finite_override_is_one_config_error(tmp_path, override):
    with pytest.raises(ConfigError, match=rf"config key '{override.split('=')[0]}' must be"):
        load_config(write_config(tmp_path, TINY), [override])
