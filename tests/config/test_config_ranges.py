"""Config numbers have an upper bound too (a mistyped exponent is one line, not a MemoryError), and a section
given a value (`model=resnet50`) points at the section's keys."""
import pytest

from basebn.config import ConfigError, load_config
from basebn.config import checks
from tests.support.cli import write_config

GOOD = """from basebn.config import BaseConfig
class Cfg(BaseConfig):
    def __init__(self):
        super().__init__()
        self.merge(dict(batch_size=16, data=dict(name="synthetic", image_size=8, train_size=96, test_size=37)))
"""


@pytest.fixture
def cfg_file(tmp_path):
    return write_config(tmp_path, GOOD)


@pytest.mark.parametrize("override, key", [
    ("batch_size=1000000000", "batch_size"),
    ("num_classes=1000000000", "num_classes"),                 # a 1e9-row classifier: MemoryError before
    ("seed=1180591620717411303424", "seed"),                  # 2**70: MegEngine's seed call raised TypeError
    ("data.image_size=1000000", "data.image_size"),           # MemoryError drawing the synthetic set
    ("data.train_size=1000000000000", "data.train_size"),     # MemoryError
    ("data.num_workers=100000", "data.num_workers"),          # would fork 100000 processes
    ("data.prefetch=100000", "data.prefetch"),
    ("solver.max_epoch=10000000000", "solver.max_epoch"),
    ("model.base_width=1000000", "model.base_width"),
])
def test_implausibly_large_numbers_are_refused_naming_the_key(cfg_file, override, key):
    with pytest.raises(ConfigError, match=rf"config key '{key}' must be at most \d+, got \d+"):
        load_config(cfg_file, [override])


def test_the_largest_allowed_values_load(cfg_file):
    cfg = load_config(cfg_file, [f"batch_size={checks.UPPER_BOUNDS['batch_size']}",
                                 f"data.num_workers={checks.UPPER_BOUNDS['data.num_workers']}",
                                 f"seed={2 ** 64 - 1}"])
    assert cfg.batch_size == checks.UPPER_BOUNDS["batch_size"] and cfg.seed == 2 ** 64 - 1


def test_a_synthetic_set_larger_than_memory_is_refused(cfg_file, monkeypatch):
    # 1000 + 37 images of 64 x 64 px at 16 bytes per pixel: 68 MB, against a machine of 32 MiB
    monkeypatch.setattr(checks, "_physical_memory_bytes", lambda: 32 << 20)
    with pytest.raises(ConfigError, match=r"synthetic set .* 1037 images of 64x64 px needs about 0\.1 GiB"):
        load_config(cfg_file, ["data.train_size=1000", "data.image_size=64"])
    load_config(cfg_file, ["data.train_size=100", "data.image_size=32"])  # 137 * 32 * 32 * 16 = 2.2 MB fits


@pytest.mark.parametrize("override, hint", [
    ("model=resnet50", "'model' is a section: did you mean 'model.name'?"),
    ("data=cifar10", "'data' is a section: did you mean 'data.name'?"),
    ("solver.grad_clip=1.0", "'solver.grad_clip' is a section: did you mean 'solver.grad_clip.name'?"),
    ("solver=sgd", "'solver' is a section: set one of its keys (solver.optimizer, solver.basic_lr"),
])
def test_a_section_given_a_value_points_at_its_keys(cfg_file, override, hint):
    with pytest.raises(ConfigError) as info:
        load_config(cfg_file, [override])
    assert hint in str(info.value) and "model.stem" not in str(info.value)


def test_a_section_given_a_value_in_a_config_file(tmp_path):
    path = tmp_path / "exp.py"
    path.write_text(GOOD + "        self.model = 'resnet50'\n")
    with pytest.raises(ConfigError, match="'model' is a section: did you mean 'model.name'"):
        load_config(str(path))
