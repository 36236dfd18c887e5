import os
import pickle

import numpy as np
import pytest

import megengine.module as M

from basebn.engine.checkpoint import (CheckpointError, atomic_write_bytes, load_checkpoint, load_model_state,
                                      resolve_weights, save_checkpoint)


def test_round_trip(tmp_path):
    payload = {"model": {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, "epoch": 3, "rng": {"numpy": None}}
    path = str(tmp_path / "ckpt.pkl")
    save_checkpoint(path, payload)
    back = load_checkpoint(path)
    assert back["epoch"] == 3
    np.testing.assert_array_equal(back["model"]["w"], payload["model"]["w"])


def test_atomic_write_keeps_old_file_when_write_fails(tmp_path, monkeypatch):
    path = str(tmp_path / "latest.pkl")
    atomic_write_bytes(path, b"old")

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        atomic_write_bytes(path, b"new")
    assert open(path, "rb").read() == b"old"
    assert os.listdir(tmp_path) == ["latest.pkl"]  # no temp file left behind


def test_truncated_and_foreign_files_fail_clearly(tmp_path):
    path = str(tmp_path / "c.pkl")
    save_checkpoint(path, {"model": {"w": np.zeros(1000, np.float32)}})
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_checkpoint(path)
    open(path, "wb").write(pickle.dumps({"hello": 1}))
    with pytest.raises(CheckpointError, match="not a basebn checkpoint"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(str(tmp_path / "missing.pkl"))


def test_mismatched_architecture_lists_keys_and_shapes():
    model = M.Sequential(M.Linear(3, 4), M.Linear(4, 2))
    state = {k: np.asarray(v) for k, v in model.state_dict().items()}
    state["1.weight"] = np.zeros((5, 4), np.float32)
    state["extra"] = np.zeros(1, np.float32)
    del state["0.bias"]
    with pytest.raises(CheckpointError) as info:
        load_model_state(model, state, source="x.pkl")
    msg = str(info.value)
    assert "0.bias" in msg and "extra" in msg and "1.weight: checkpoint (5, 4) vs model (2, 4)" in msg


def test_resolve_run_directory(tmp_path):
    with pytest.raises(CheckpointError, match="neither"):
        resolve_weights(str(tmp_path))
    save_checkpoint(str(tmp_path / "latest.pkl"), {"model": {}})
    assert resolve_weights(str(tmp_path)).endswith("latest.pkl")
    save_checkpoint(str(tmp_path / "final.pkl"), {"model": {}})
    assert resolve_weights(str(tmp_path)).endswith("final.pkl")
