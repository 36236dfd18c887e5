"""A precise-BN batch larger than the training split is refused naming the key the size comes from
(bn.precise_batch_size), in training and in recalibration, not batch_size."""
import pytest

from basebn.config import load_config
from basebn.data import DataError
from basebn.engine.build import build_precise_bn_loader
from basebn.tools.recalibrate import recalibrate


def test_a_precise_batch_larger_than_the_split_names_its_key(tiny):
    cfg = load_config(tiny, ["bn.precise_every_n_epoch=1", "bn.precise_batch_size=512"])  # 96 training images
    for build in (build_precise_bn_loader, lambda c: recalibrate(c, "never-read.npz", "never-written.npz")):
        with pytest.raises(DataError) as info:
            build(cfg)
        message = str(info.value)
        assert message.startswith("bn.precise_batch_size=512: ") and "has 96 per process" in message, message
        assert message.endswith("lower bn.precise_batch_size") and "batch_size=512 x" not in message, message
