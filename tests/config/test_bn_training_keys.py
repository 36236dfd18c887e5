"""The bn.* training keys (docs/bn_training.md) fail at config load with one line naming the key; good values
load. Reference: the rules as the issue states them."""
import pytest

from basebn.config import ConfigError, load_config


@pytest.mark.parametrize("overrides, words", [
    (["bn.norm_batch_size=0"], "bn.norm_batch_size"),
    (["batch_size=64", "bn.norm_batch_size=5"], "must divide batch_size=64"),
    (["bn.norm_batch_size=8", "model.norm=GN"], "model.norm='BN' only"),
    (["bn.renorm.r_max=0.5"], "bn.renorm.r_max"),
    (["bn.renorm.d_max=-1"], "bn.renorm.d_max"),
    (["solver.max_epoch=4", "bn.freeze_last_epochs=5"], "bn.freeze_last_epochs=5 must be at most"),
    (["bn.freeze_last_epochs=-1"], "bn.freeze_last_epochs"),
    (["bn.sync_buffers=foo"], "bn.sync_buffers"),
    (["bn.accumulation_aware=1"], "bn.accumulation_aware"),
    (["trace=True", "model.norm=BRN"], "trace=True"),
])
def test_bad_values_fail_in_one_line(tiny, overrides, words):
    with pytest.raises(ConfigError) as err:
        load_config(tiny, overrides)
    msg = str(err.value)
    assert words in msg and "\n" not in msg


def test_good_values_load(tiny):
    cfg = load_config(tiny, ["batch_size=32", "bn.norm_batch_size=8", "bn.freeze_last_epochs=2",
                             "bn.sync_buffers=broadcast", "bn.renorm.r_max=2.0", "bn.renorm.d_max=0"])
    assert (cfg.bn.norm_batch_size, cfg.bn.freeze_last_epochs, cfg.bn.sync_buffers) == (8, 2, "broadcast")
    assert load_config(tiny, ["model.norm=SyncBRN"]).model.norm == "SyncBRN"
