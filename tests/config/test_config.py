import math

import pytest

from basebn.config import BaseConfig, ConfigError, config_diff, flatten, load_config


def write(tmp_path, body, name="exp.py"):
    path = tmp_path / name
    path.write_text("from basebn.config import BaseConfig\n" + body)
    return str(path)


GOOD = """
class Cfg(BaseConfig):
    def __init__(self):
        super().__init__()
        self.merge(dict(batch_size=32, solver=dict(max_epoch=3)))
"""


def test_file_and_overrides_merge_with_defaults(tmp_path):
    cfg = load_config(write(tmp_path, GOOD), ["solver.basic_lr=0.05", "model.name=resnet32",
                                              "bn.precise_every_n_epoch=inf", "data.mean=(1.0,)"])
    assert cfg.batch_size == 32 and cfg.solver.max_epoch == 3
    assert cfg.solver.basic_lr == 0.05 and cfg.model.name == "resnet32"
    assert cfg.bn.precise_every_n_epoch == math.inf
    assert cfg.data.mean == (1.0,)
    assert cfg.solver.momentum == BaseConfig().solver.momentum  # untouched default survives the merge
    assert cfg.output_dir == "runs/exp-resnet32"  # the model is not the file's: the run is named after both
    assert config_diff(cfg) == {"batch_size": 32, "solver.max_epoch": 3, "solver.basic_lr": 0.05,
                                "model.name": "resnet32",
                                "data.mean": (1.0,), "output_dir": "runs/exp-resnet32"}


def test_int_given_for_float_is_accepted(tmp_path):
    assert load_config(write(tmp_path, GOOD), ["solver.basic_lr=1"]).solver.basic_lr == 1.0


@pytest.mark.parametrize("override, hint", [
    ("solver.max_epochs=3", "did you mean 'solver.max_epoch'"),
    ("max_epochs=3", "did you mean 'solver.max_epoch'"),
    ("bn.momentun=0.99", "did you mean 'bn.momentum'"),
])
def test_unknown_override_names_nearest_key(tmp_path, override, hint):
    with pytest.raises(ConfigError, match=hint):
        load_config(write(tmp_path, GOOD), [override])


def test_wrong_type_and_bad_values(tmp_path):
    with pytest.raises(ConfigError, match="expects a int"):
        load_config(write(tmp_path, GOOD), ["solver.max_epoch=abc"])
    with pytest.raises(ConfigError, match="bool"):
        load_config(write(tmp_path, GOOD), ["model_ema.enabled=1"])
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        load_config(write(tmp_path, GOOD), ["solver.max_epoch"])
    with pytest.raises(ConfigError, match="lr_schedule"):
        load_config(write(tmp_path, GOOD), ["solver.lr_schedule=poly"])


def test_unknown_key_in_file(tmp_path):
    body = GOOD.replace("max_epoch=3", "max_epochs=3")
    with pytest.raises(ConfigError, match="solver.max_epochs.*did you mean 'solver.max_epoch'"):
        load_config(write(tmp_path, body))


def test_missing_and_broken_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(str(tmp_path / "nope.py"))
    with pytest.raises(ConfigError, match="failed to load: SyntaxError"):
        load_config(write(tmp_path, "class Cfg(BaseConfig:\n"))
    with pytest.raises(ConfigError, match="defines no `Cfg`"):
        load_config(write(tmp_path, "x = 1\n"))


def test_shipped_configs_load(repo_root):
    import glob
    import os

    paths = sorted(glob.glob(os.path.join(repo_root, "configs", "*.py")))
    assert paths
    for path in paths:
        cfg = load_config(path)
        assert set(flatten(cfg)) <= set(flatten(BaseConfig()))


def test_config_derives_from_another_file(tmp_path):
    write(tmp_path, GOOD, name="base.py")
    child = write(tmp_path, (
        "import os\nfrom basebn.config import config_class\n"
        "Base = config_class(os.path.join(os.path.dirname(__file__), 'base.py'))\n"
        "class Cfg(Base):\n    def __init__(self):\n        super().__init__()\n"
        "        self.merge(dict(solver=dict(basic_lr=0.01)))\n"), name="child.py")
    cfg = load_config(child)
    assert cfg.batch_size == 32 and cfg.solver.max_epoch == 3  # from base.py
    assert cfg.solver.basic_lr == 0.01  # its own
    bad = write(tmp_path, "from basebn.config import config_class\nBase = config_class('/nope/base.py')\n",
                name="bad.py")
    with pytest.raises(ConfigError, match="nope/base.py.*does not exist"):
        load_config(bad)


def test_config_derives_relative_to_its_own_file(tmp_path, monkeypatch):
    sub = tmp_path / "cfgs"
    sub.mkdir()
    write(sub, GOOD, name="base.py")
    child = write(sub, (
        "from basebn.config import config_class\n"
        "Base = config_class('base.py', relative_to=__file__)\n"
        "class Cfg(Base):\n    pass\n"), name="child.py")
    monkeypatch.chdir(tmp_path)  # base.py is not in the working directory: found next to child.py
    cfg = load_config(child)
    assert cfg.batch_size == 32 and cfg.solver.max_epoch == 3
    missing = write(sub, (
        "from basebn.config import config_class\n"
        "Base = config_class('other.py', relative_to=__file__)\n"), name="missing.py")
    with pytest.raises(ConfigError, match="cfgs/other.py.*does not exist"):
        load_config(missing)


# Each value below once crashed later with a traceback (or ran silently); the rule rejects it at load time.
@pytest.mark.parametrize("override, key, expected", [
    ("solver.basic_lr=nan", "solver.basic_lr", "finite number > 0"),
    ("solver.basic_lr=-0.1", "solver.basic_lr", "finite number > 0"),
    ("solver.momentum=-1", "solver.momentum", "[0, 1)"),
    ("solver.max_epoch=inf", "solver.max_epoch", "integer >= 1"),
    ("solver.max_epoch=1.5", "solver.max_epoch", "integer >= 1"),
    ("batch_size=2.5", "batch_size", "integer >= 1"),
    ("model.name=resnet99", "model.name", "list_models() (closest: resnet56"),
    ("model.norm=BatchNorm", "model.norm", "'SyncBN'"),
    ("model.stem=foo", "model.stem", "'imagenet'"),
    ("data.image_size=2", "data.image_size", "integer >= 8"),
    ("data.name=imagenet", "data.name", "imagefolder"),
    ("bn.precise_every_n_epoch=1.5", "bn.precise_every_n_epoch", "-1"),
    ("bn.eps=0", "bn.eps", "> 0"),
    ("solver.betas=(0.9,)", "solver.betas", "list of 2"),
    ("data.std=[0]", "data.std", "> 0"),
    ("eval_every_n_epoch=0", "eval_every_n_epoch", "or inf"),
])
def test_bad_values_name_key_and_rule(tmp_path, override, key, expected):
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, GOOD), [override])
    assert repr(key) in str(info.value) and expected in str(info.value)


@pytest.mark.parametrize("override", ["save_every_n_epoch=inf", "eval_every_n_epoch=inf", "bn.precise_every_n_epoch=-1",
                                      "bn.precise_every_n_epoch=1", "bn.precise_every_n_epoch=2",
                                      "solver.warmup_epochs=0.25", "data.name=Fashion-MNIST", "model.norm=GN"])
def test_documented_special_values_are_accepted(tmp_path, override):
    load_config(write(tmp_path, GOOD), [override])


def test_cross_key_rules(tmp_path):
    with pytest.raises(ConfigError, match="lower must be < solver.grad_clip.upper"):
        load_config(write(tmp_path, GOOD), ["solver.grad_clip.lower=1.0", "solver.grad_clip.upper=-1.0"])
    with pytest.raises(ConfigError, match="3 values for data.channels=1"):
        load_config(write(tmp_path, GOOD), ["data.channels=1", "data.mean=(1.0, 2.0, 3.0)"])


def test_a_bad_value_in_a_config_file_is_caught_too(tmp_path):
    body = "class Cfg(BaseConfig):\n    def __init__(self):\n        super().__init__()\n        self.batch_size = 2.5\n"
    with pytest.raises(ConfigError, match="'batch_size' must be an integer"):
        load_config(write(tmp_path, body))


def test_every_key_has_a_rule():
    from basebn.config.checks import RULES

    assert set(flatten(BaseConfig())) == set(RULES)
