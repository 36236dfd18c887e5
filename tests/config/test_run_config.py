"""A run directory (or its config.json) as the config, the config weights record and where a given config differs
from it, and the default run directory named after what ran."""
import json
import math
import os

import pytest

from basebn.config import BaseConfig, ConfigError, flatten, load_config, run_dir_of
from basebn.config.recorded import RESULT_KEYS, config_mismatches, describe_mismatch, mismatch_refusal

GOOD = """from basebn.config import BaseConfig
class Cfg(BaseConfig):
    def __init__(self):
        super().__init__()
        self.merge(dict(batch_size=32, solver=dict(max_epoch=3)))
"""


def saved_run(tmp_path, name="run", **changes):
    """A run directory holding config.json as basebn.train writes it (json.dumps, default=str), with `changes`
    (flat keys) applied to the defaults; returns (run_dir, the flat config written)."""
    flat = flatten(BaseConfig())
    flat.update({"output_dir": "runs/elsewhere", **changes})
    nested = {}
    for key, value in flat.items():
        node = nested
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    run_dir = tmp_path / name
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps(nested, indent=2, default=str))
    return str(run_dir), flat


CHANGES = {"model.base_width": 6, "data.image_size": 12, "solver.max_epoch": 3, "data.mean": (0.5,),
           "data.std": (2.0,), "solver.grad_clip.max_norm": math.inf, "data.rrc_scale": (0.2, 1.0)}


@pytest.mark.parametrize("as_file", [False, True])
def test_a_run_directory_or_its_config_json_is_the_runs_config(tmp_path, as_file):
    run_dir, flat = saved_run(tmp_path, **CHANGES)
    spec = os.path.join(run_dir, "config.json") if as_file else run_dir + "/"
    cfg = load_config(spec)
    got = flatten(cfg)
    for key, value in flat.items():
        if key != "output_dir":
            assert got[key] == value and type(got[key]) is type(value), key  # tuples come back as tuples
    assert cfg.output_dir == run_dir == run_dir_of(spec)  # the run it names, not the path config.json recorded


def test_overrides_on_a_run_config_go_through_the_same_checks(tmp_path):
    run_dir, _ = saved_run(tmp_path, **CHANGES)
    cfg = load_config(run_dir, ["data.image_size=16", "output_dir=/tmp/x"])
    assert cfg.data.image_size == 16 and cfg.model.base_width == 6 and cfg.output_dir == "/tmp/x"
    with pytest.raises(ConfigError, match="did you mean 'solver.max_epoch'"):
        load_config(run_dir, ["solver.max_epochs=3"])
    with pytest.raises(ConfigError, match="'data.image_size' must be None or an integer >= 8, got 2"):
        load_config(run_dir, ["data.image_size=2"])


def test_a_bad_value_or_key_in_a_config_json_is_named(tmp_path):
    run_dir, _ = saved_run(tmp_path, **{"batch_size": 2.5})
    with pytest.raises(ConfigError, match="'batch_size' must be an integer"):
        load_config(run_dir)
    other, _ = saved_run(tmp_path, name="other", **{"solver.max_epochs": 3})
    with pytest.raises(ConfigError, match="unknown config key 'solver.max_epochs' in .*config.json"):
        load_config(other)


def test_what_is_not_a_config_gets_one_line(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match="holds no config.json, so it is not a run directory"):
        load_config(str(empty))
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(str(tmp_path / "nope" / "config.json"))
    with pytest.raises(ConfigError, match="other.json' does not exist"):
        load_config(str(empty / "other.json"))
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(ConfigError, match="is not a JSON config"):
        load_config(str(tmp_path / "broken.json"))
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="is not a config basebn.train wrote"):
        load_config(str(tmp_path / "list.json"))
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ConfigError, match="neither an experiment file"):
        load_config(str(tmp_path / "notes.txt"))


# -- the default run directory: named after the config and, when another, the model ----------------------------

def test_default_run_dir_names_the_model_when_it_is_not_the_configs(repo_root):
    path = os.path.join(repo_root, "configs", "imagenet_resnet50.py")
    assert load_config(path).output_dir == os.path.join("runs", "imagenet_resnet50")
    assert load_config(path, ["model.name=resnet50"]).output_dir == os.path.join("runs", "imagenet_resnet50")
    assert load_config(path, ["model.name=resnet18"]).output_dir == os.path.join("runs", "imagenet_resnet50-resnet18")
    assert load_config(path, ["model.name=resnet18", "output_dir=/data/r18"]).output_dir == "/data/r18"


def test_default_run_dir_of_a_config_without_model_override(tmp_path):
    path = tmp_path / "exp.py"
    path.write_text(GOOD)
    assert load_config(str(path)).output_dir == os.path.join("runs", "exp")


# -- a config that disagrees with the one the weights were trained with ---------------------------------------

RECORDED = flatten(json.loads(json.dumps(BaseConfig(
    dict(num_classes=10, model=dict(name="resnet18", base_width=32, stem="small", norm="BN"),
         data=dict(image_size=64, channels=3, crop_pct=0.875, mean=(125.3, 123.0, 113.9), std=(63.0, 62.1, 66.7))),
).to_dict())))  # as a checkpoint records it: tuples as JSON lists


@pytest.mark.parametrize("key, given", [
    ("model.name", "resnet20"),
    ("model.base_width", 16),
    ("model.stem", "imagenet"),
    ("model.norm", "GN"),
    ("num_classes", 100),
    ("data.channels", 1),
    ("data.image_size", 224),
    ("data.crop_pct", 1.0),
    ("data.mean", (0.0, 0.0, 0.0)),
    ("data.std", (1.0, 1.0, 1.0)),
])
def test_each_result_key_that_differs_gets_its_line(key, given):
    config = dict(RECORDED, **{key: given})
    assert config_mismatches(config, RECORDED) == [(key, RECORDED[key], given)]
    recorded = tuple(RECORDED[key]) if isinstance(RECORDED[key], list) else RECORDED[key]
    line = describe_mismatch("runs/x/final.npz", key, RECORDED[key], given)
    assert "\n" not in line
    assert f"trained with {key}={recorded!r}" in line and f"the config gives {key}={given!r}" in line
    refusal = mismatch_refusal("runs/x/final.npz", config_mismatches(config, RECORDED))
    assert "\n" not in refusal and f"{key}={recorded!r} (the config gives {given!r})" in refusal


def test_what_does_not_change_results_is_not_compared():
    config = dict(RECORDED, **{"solver.basic_lr": 0.5, "batch_size": 7, "data.root": "/elsewhere", "seed": 1})
    assert config_mismatches(config, RECORDED) == []
    assert config_mismatches(dict(RECORDED), RECORDED) == []  # tuples given, lists recorded: equal
    assert config_mismatches(config, None) == []  # weights that record no config
    older = {k: v for k, v in RECORDED.items() if k != "model.stem"}  # a run of a basebn without the key
    assert config_mismatches(dict(RECORDED, **{"model.stem": "imagenet"}), older) == []
    assert {"model.name", "model.base_width", "num_classes", "data.image_size", "data.crop_pct", "data.mean",
            "data.std", "data.channels", "model.norm"} <= set(RESULT_KEYS)
