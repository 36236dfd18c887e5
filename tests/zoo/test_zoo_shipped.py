"""The shipped zoo (zoo/zoo.json + weights): complete entries, hashes that match, weights that load, and one
entry re-evaluated against its recorded top-1 when Fashion-MNIST is installed."""
import hashlib
import os
import shlex

import numpy as np
import pytest

import basebn.zoo as zoo
from basebn.data.idx import FASHION_MNIST_DEFAULT_ROOT
from basebn.engine.build import build_model_from_cfg, zoo_config
from basebn.models import load_weights, read_weights
from basebn.tools.zoo_export import build_parser
from basebn.zoo.config_files import config_closure

REQUIRED = ("name", "config", "weights", "sha256", "top1", "top5", "dataset", "command")
ENTRIES = zoo.list_entries()


def test_zoo_index_is_complete():
    names = [e["name"] for e in ENTRIES]
    assert len(names) == len(set(names)), "duplicate zoo names"
    for e in ENTRIES:
        missing = [k for k in REQUIRED if k not in e]
        assert not missing, f"{e.get('name')}: missing {missing}"
        assert 0 < e["top1"] <= e["top5"] <= 100


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["name"] for e in ENTRIES])
def test_recorded_command_trains_then_exports_this_entry(entry):
    """Users copy the command from zoo/README.md: its export step must parse with the exporter's own CLI
    and re-create this entry (same name, config, EMA and precise-BN choice) from the run the training wrote."""
    train, sep, export = entry["command"].partition("; python -m basebn.tools.zoo_export ")
    assert sep, f"{entry['name']}: the command has no export step"
    assert f"basebn.train {entry['config']}" in train
    args = build_parser().parse_args(shlex.split(export))
    assert (args.name, args.config, args.ema, args.precise_bn) == (
        entry["name"], entry["config"], entry["ema"], entry["precise_bn"])
    assert f"output_dir={args.run_dir}" in train.split()


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["name"] for e in ENTRIES])
def test_weights_match_hash_and_load(entry):
    path = os.path.join(zoo.zoo_dir(), entry["weights"])
    with open(path, "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == entry["sha256"]
    cfg = zoo_config(entry["name"])
    model = build_model_from_cfg(cfg, in_channels=1)
    load_weights(model, "zoo:" + entry["name"])  # strict: raises on any missing key or shape


def test_shipped_configs_resolve_in_the_repository(repo_root, monkeypatch):
    monkeypatch.delenv("BASEBN_ZOO", raising=False)
    for e in ENTRIES:
        assert zoo.entry_config_path(e) == os.path.join(repo_root, e["config"])


def test_every_entry_records_the_hashes_of_the_configs_it_runs(repo_root, monkeypatch):
    """config_sha256 covers the entry's config and every config it derives from, with the files' own sha256."""
    monkeypatch.delenv("BASEBN_ZOO", raising=False)
    for e in ENTRIES:
        config = os.path.join(repo_root, e["config"])
        assert sorted(e["config_sha256"]) == sorted(config_closure(config, repo_root)), e["name"]
        for key, sha in e["config_sha256"].items():
            with open(os.path.join(repo_root, key), "rb") as f:
                assert hashlib.sha256(f.read()).hexdigest() == sha, (e["name"], key)
    finetune = next(e for e in ENTRIES if e["config"] == "configs/fmnist_finetune.py")
    assert "configs/fmnist_resnet20.py" in finetune["config_sha256"]  # the config it derives from


def test_zoo_file_given_as_a_path_loads(repo_root):
    """`-w zoo/fmnist_r20.npz`: a zoo file is a valid weights file (it has no checksum entry: legacy/zoo)."""
    path = os.path.join(repo_root, "zoo", "fmnist_r20.npz")
    state, source = read_weights(path)
    with np.load(path, allow_pickle=False) as z:
        expected = {k[len("model/"):]: z[k] for k in z.files if k.startswith("model/")}
    assert source == path and sorted(state) == sorted(expected) and len(expected) > 50
    for k in expected:
        np.testing.assert_array_equal(state[k], expected[k])
    model = build_model_from_cfg(zoo_config("fmnist_r20"), in_channels=1)
    load_weights(model, path)  # strict


@pytest.mark.skipif(not os.path.isdir(FASHION_MNIST_DEFAULT_ROOT), reason="Fashion-MNIST not installed")
def test_zoo_entry_reproduces_recorded_top1():
    from basebn.test import test

    entry = next(e for e in ENTRIES if e["name"] == "fmnist_r20")
    metrics = test(zoo_config(entry["name"]), "zoo:" + entry["name"])
    assert metrics["images"] == 10000
    assert abs(metrics["top1"] - entry["top1"]) <= 0.05
