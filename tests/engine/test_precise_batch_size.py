"""bn.precise_batch_size: the precise-BN pass (and recalibration) draws batches of the size training normalised
with, so precise_method="batch_average" averages statistics of batches of that size."""
import pytest

from basebn.config import ConfigError, load_config
from basebn.engine.build import build_precise_bn_loader


def first_batch_size(tiny, *overrides):
    cfg = load_config(tiny, ["bn.precise_every_n_epoch=1", *overrides])
    loader = build_precise_bn_loader(cfg)
    loader.set_epoch(0)
    images, _ = next(iter(loader))
    return len(images)


@pytest.mark.parametrize("overrides, expected", [
    ((), 16),                                                       # the tiny config's batch_size
    (("bn.norm_batch_size=8",), 8),                                 # ghost BN: the normalisation batch
    (("bn.precise_batch_size=4",), 4),
    (("bn.norm_batch_size=8", "bn.precise_batch_size=4"), 4),       # an explicit size wins
])
def test_precise_batches_have_the_normalisation_size(tiny, overrides, expected):
    assert first_batch_size(tiny, *overrides) == expected


@pytest.mark.parametrize("value", ["0", "-2", "2.5", "'8'"])
def test_a_bad_precise_batch_size_fails_at_load(tiny, value):
    with pytest.raises(ConfigError, match="bn.precise_batch_size"):
        load_config(tiny, [f"bn.precise_batch_size={value}"])
