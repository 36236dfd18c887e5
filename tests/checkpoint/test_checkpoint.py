"""Checkpoint files: the pickle-free .npz container and its checksum, legacy .pkl read without running code,
atomic writes and their leftovers, the run directory's files. References are written by hand here."""
import hashlib
import io
import json
import os
import pickle
import random
import subprocess
import sys

import numpy as np
import pytest

import megengine.module as M

from basebn.checkpoint import (CheckpointError, complete_run, load_checkpoint, load_latest, load_model_state,
                               resolve_weights, save_checkpoint)
from basebn.utils.fs import atomic_write_bytes, remove_stale_tmp
from tests.support import ROOT



def payload(epoch=3):
    """A training payload shaped like the trainer's: int-keyed optimizer state, tuples, numpy scalars, RNG."""
    rs = np.random.RandomState(7)
    return {
        "kind": "training",
        "model": {"conv.weight": rs.randn(2, 3).astype(np.float32), "bn.num_batches": np.array([5], np.int64)},
        "ema": {"module": {"conv.weight": np.ones((2, 3), np.float32)}, "momentum": 0.998, "updates": 12},
        "optimizer": {"param_groups": [{"params": [0, 1], "lr": np.float32(0.05), "nesterov": False}],
                      "state": {0: {"momentum_buffer": np.full((2, 3), 0.5, np.float32)}}},
        "scaler": {"scale_factor": 1024.0, "_growth_tracker": 3, "_found_non_finite": False},
        "epoch": epoch, "best_top1": 61.5, "best_epoch": 2, "metrics": {"epoch": epoch, "top1": 60.0},
        "rng": {"numpy": rs.get_state(), "python": random.Random(1).getstate()},
        "config": {"solver": {"betas": (0.9, 0.999), "max_epoch": 4}, "eval_every_n_epoch": float("inf")},
    }


def raw_entries(path):
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def canonical_sha256(entries):
    """The documented checksum: per entry sorted by name, an 8-byte little-endian length + JSON
    [name, dtype.str, shape, nbytes], then the array's C-order bytes."""
    h = hashlib.sha256()
    for name in sorted(entries):
        a = entries[name]
        header = json.dumps([name, a.dtype.str, list(a.shape), a.nbytes]).encode()
        h.update(len(header).to_bytes(8, "little") + header + a.tobytes())
    return h.hexdigest()


def savez(path, **arrays):
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    with open(path, "wb") as f:
        f.write(buf.getvalue())


def test_round_trip_keeps_every_value_and_type(tmp_path):
    path = str(tmp_path / "latest.npz")
    p = payload()
    save_checkpoint(path, p)
    back = load_checkpoint(path)
    for k in p["model"]:
        np.testing.assert_array_equal(back["model"][k], p["model"][k])
        assert back["model"][k].dtype == p["model"][k].dtype
    np.testing.assert_array_equal(back["ema"]["module"]["conv.weight"], np.ones((2, 3)))
    assert (back["ema"]["momentum"], back["ema"]["updates"]) == (0.998, 12)
    group = back["optimizer"]["param_groups"][0]
    assert group["params"] == [0, 1] and group["nesterov"] is False
    assert type(group["lr"]) is np.float32 and group["lr"] == np.float32(0.05)
    assert list(back["optimizer"]["state"]) == [0]  # int keys stay ints
    np.testing.assert_array_equal(back["optimizer"]["state"][0]["momentum_buffer"], np.full((2, 3), 0.5))
    assert back["scaler"] == {"scale_factor": 1024.0, "_growth_tracker": 3, "_found_non_finite": False}
    assert (back["epoch"], back["best_top1"], back["best_epoch"]) == (3, 61.5, 2)
    assert back["config"] == {"solver": {"betas": (0.9, 0.999), "max_epoch": 4}, "eval_every_n_epoch": float("inf")}
    assert back["rng"]["python"] == random.Random(1).getstate()
    ref = p["rng"]["numpy"]
    assert back["rng"]["numpy"][0] == ref[0] and back["rng"]["numpy"][2:] == ref[2:]
    np.testing.assert_array_equal(back["rng"]["numpy"][1], ref[1])


def test_file_is_plain_npz_with_documented_checksum(tmp_path):
    path = str(tmp_path / "c.npz")
    save_checkpoint(path, payload())
    entries = raw_entries(path)  # readable without pickle
    assert all(a.dtype != object for a in entries.values())
    np.testing.assert_array_equal(entries["model/conv.weight"], payload()["model"]["conv.weight"])
    meta = json.loads(entries["__meta__"].tobytes())
    assert meta["epoch"] == 3 and meta["best_epoch"] == 2 and meta["format"] == "basebn-checkpoint-v2"
    stored = entries.pop("__sha256__").tobytes().decode()
    assert stored == canonical_sha256(entries)


def test_flipped_bit_is_detected(tmp_path):
    path = str(tmp_path / "c.npz")
    save_checkpoint(path, payload())
    good = open(path, "rb").read()
    # 1) one bit of an array's bytes flipped inside the file
    target = payload()["model"]["conv.weight"].tobytes()
    at = good.index(target) + 5
    open(path, "wb").write(good[:at] + bytes([good[at] ^ 0x10]) + good[at + 1:])
    with pytest.raises(CheckpointError, match="corrupt|checksum"):
        load_checkpoint(path)
    # 2) a consistent zip whose content no longer matches the stored checksum (zip CRCs cannot catch this)
    open(path, "wb").write(good)
    entries = raw_entries(path)
    entries["model/conv.weight"] = entries["model/conv.weight"].copy()
    entries["model/conv.weight"].view(np.uint32)[0] ^= 1
    savez(path, **entries)
    with pytest.raises(CheckpointError, match="fails its checksum"):
        load_checkpoint(path)


def test_checkpoint_without_its_checksum_is_refused(tmp_path):
    path = str(tmp_path / "c.npz")
    save_checkpoint(path, payload())
    entries = raw_entries(path)
    del entries["__sha256__"]
    savez(path, **entries)
    with pytest.raises(CheckpointError, match="without its checksum"):
        load_checkpoint(path)


def test_atomic_write_keeps_old_file_when_write_fails(tmp_path, monkeypatch):
    path = str(tmp_path / "latest.npz")
    atomic_write_bytes(path, b"old")

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        atomic_write_bytes(path, b"new")
    assert open(path, "rb").read() == b"old"
    assert os.listdir(tmp_path) == ["latest.npz"]  # no temp file left behind


def test_remove_stale_tmp_removes_what_a_killed_write_left(tmp_path):
    # a writer killed between its temp file and the rename (os._exit skips every clean-up)
    code = ("import os, sys; sys.path.insert(0, sys.argv[2]); import basebn.utils.fs as fs; "
            "os.replace = lambda *a: os._exit(9); fs.atomic_write_bytes(sys.argv[1], b'x' * 100)")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "latest.npz"), ROOT])
    assert r.returncode == 9
    leftovers = [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
    assert len(leftovers) == 1 and leftovers[0].startswith("latest.npz.")
    keep = ["latest.npz", "notes.tmp", "a.b.tmp", "metrics.jsonl", "x.abcdefgh.tmp.bak", "x.ABCDEFGH.tmp"]
    for name in keep:
        (tmp_path / name).write_text("keep")
    (tmp_path / "metrics.jsonl.k2_9zq0x.tmp").write_text("partial")
    (tmp_path / "sub.abcdefgh.tmp").mkdir()  # a directory is never removed
    removed = remove_stale_tmp(str(tmp_path))
    assert removed == sorted(leftovers + ["metrics.jsonl.k2_9zq0x.tmp"])
    assert sorted(os.listdir(tmp_path)) == sorted(keep + ["sub.abcdefgh.tmp"])
    assert remove_stale_tmp(str(tmp_path / "missing")) == []


def test_truncated_and_foreign_files_fail_clearly(tmp_path):
    path = str(tmp_path / "c.npz")
    save_checkpoint(path, payload())
    data = open(path, "rb").read()
    for cut in (100, len(data) // 2, len(data) - 10):
        open(path, "wb").write(data[:cut])
        with pytest.raises(CheckpointError, match="truncated or corrupt"):
            load_checkpoint(path)
    open(path, "wb").write(pickle.dumps({"hello": 1}))
    with pytest.raises(CheckpointError, match="not a basebn checkpoint"):
        load_checkpoint(path)
    open(path, "wb").write(b"hello world")
    with pytest.raises(CheckpointError, match="not an .npz"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(str(tmp_path / "missing.npz"))


def test_npz_with_object_array_is_refused(tmp_path):
    path = str(tmp_path / "obj.npz")
    savez(path, **{"model/w": np.array([{"a": 1}], dtype=object)})
    with pytest.raises(CheckpointError, match="object array"):
        load_checkpoint(path)


def legacy_payload():
    """The pickled layout of runs before the .npz format (format basebn-checkpoint-v1)."""
    rs = np.random.RandomState(3)
    return {"format": "basebn-checkpoint-v1", "model": {"w": np.arange(4, dtype=np.float32)},
            "ema": None, "optimizer": {"param_groups": [{"params": [0], "lr": 0.1}],
                                       "state": {0: {"momentum_buffer": np.zeros(4, np.float32)}}},
            "scaler": None, "epoch": 2, "best_top1": 50.0, "rng": {"numpy": rs.get_state(),
                                                                   "python": random.Random(2).getstate()},
            "config": {"solver": {"betas": (0.9, 0.999)}}, "np_scalar": np.float64(1.5)}


def test_legacy_pickle_loads(tmp_path):
    path = str(tmp_path / "latest.pkl")
    with open(path, "wb") as f:
        pickle.dump(legacy_payload(), f, protocol=4)
    back = load_checkpoint(path)
    np.testing.assert_array_equal(back["model"]["w"], np.arange(4))
    assert back["epoch"] == 2 and back["config"]["solver"]["betas"] == (0.9, 0.999)
    assert back["np_scalar"] == 1.5 and back["rng"]["python"] == random.Random(2).getstate()
    with open(path, "wb") as f:  # a bare state dict (megengine.save(model.state_dict()) of numpy arrays)
        pickle.dump({"w": np.ones(2, np.float32)}, f, protocol=4)
    np.testing.assert_array_equal(load_checkpoint(path)["model"]["w"], np.ones(2))


class _CreatesFile:
    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return open, (self.target, "w")


class _RunsShell:
    def __reduce__(self):
        return os.system, ("echo pwned > /dev/null",)


def test_legacy_pickle_with_code_is_refused_and_runs_nothing(tmp_path):
    target = tmp_path / "created_by_pickle"
    path = str(tmp_path / "evil.pkl")
    with open(path, "wb") as f:
        pickle.dump({"format": "basebn-checkpoint-v1", "model": {"w": np.zeros(1)}, "x": _CreatesFile(str(target))},
                    f, protocol=4)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    assert "refused to load global io.open" in str(info.value) and path in str(info.value)
    assert not target.exists()
    with open(path, "wb") as f:
        pickle.dump(_RunsShell(), f, protocol=2)
    with pytest.raises(CheckpointError, match=r"refused to load global (posix|os)\.system"):
        load_checkpoint(path)


def test_mismatched_architecture_lists_keys_and_shapes():
    model = M.Sequential(M.Linear(3, 4), M.Linear(4, 2))
    state = {k: np.asarray(v) for k, v in model.state_dict().items()}
    state["1.weight"] = np.zeros((5, 4), np.float32)
    state["extra"] = np.zeros(1, np.float32)
    del state["0.bias"]
    with pytest.raises(CheckpointError) as info:
        load_model_state(model, state, source="x.npz")
    msg = str(info.value)
    assert "0.bias" in msg and "extra" in msg and "1.weight: checkpoint (5, 4) vs model (2, 4)" in msg


def test_resolve_run_directory(tmp_path):
    with pytest.raises(CheckpointError, match="neither"):
        resolve_weights(str(tmp_path))
    with open(tmp_path / "latest.pkl", "wb") as f:  # a legacy run
        pickle.dump({"format": "basebn-checkpoint-v1", "model": {}}, f)
    assert resolve_weights(str(tmp_path)).endswith("latest.pkl")
    save_checkpoint(str(tmp_path / "latest.npz"), {"model": {}})
    assert resolve_weights(str(tmp_path)).endswith("latest.npz")
    save_checkpoint(str(tmp_path / "final.npz"), {"model": {}})
    assert resolve_weights(str(tmp_path)).endswith("final.npz")


def test_damaged_latest_names_the_epoch_files_that_could_replace_it(tmp_path):
    for epoch in (1, 2, 10):
        save_checkpoint(str(tmp_path / f"epoch_{epoch}.npz"), payload(epoch))
    save_checkpoint(str(tmp_path / "latest.npz"), payload(10))
    data = open(tmp_path / "latest.npz", "rb").read()
    open(tmp_path / "latest.npz", "wb").write(data[: len(data) // 3])
    with pytest.raises(CheckpointError) as info:
        load_latest(str(tmp_path))
    assert "truncated or corrupt" in str(info.value)
    assert "epoch_10.npz, epoch_2.npz, epoch_1.npz" in str(info.value)
    for epoch in (1, 2, 10):
        os.remove(tmp_path / f"epoch_{epoch}.npz")
    with pytest.raises(CheckpointError, match="no epoch_N checkpoint"):
        load_latest(str(tmp_path))
    assert load_latest(str(tmp_path / "nothing")) is None


def test_complete_run_writes_missing_best_and_final(tmp_path):
    latest = payload(epoch=4)
    latest["best_epoch"] = 4  # the last epoch improved, but a kill (old write order) left best at epoch 2
    save_checkpoint(str(tmp_path / "best.npz"), payload(epoch=2))
    done = complete_run(str(tmp_path), latest, finished=True)
    assert done == ["best.npz (epoch 4)", "final.npz (epoch 4)"]
    best, final = raw_entries(str(tmp_path / "best.npz")), raw_entries(str(tmp_path / "final.npz"))
    assert json.loads(best["__meta__"].tobytes())["epoch"] == 4
    meta = json.loads(final["__meta__"].tobytes())
    assert meta["epoch"] == 4 and meta["metrics"] == {"epoch": 4, "top1": 60.0} and "optimizer" not in meta
    np.testing.assert_array_equal(final["model/conv.weight"], latest["model"]["conv.weight"])
    np.testing.assert_array_equal(final["ema/conv.weight"], np.ones((2, 3)))
    assert complete_run(str(tmp_path), latest, finished=True) == []  # nothing left to do
    # best of an earlier epoch is taken from its epoch file; without one it is reported, not invented
    latest["best_epoch"] = 3
    assert "not recoverable" in complete_run(str(tmp_path), latest, finished=False)[0]
    save_checkpoint(str(tmp_path / "epoch_3.npz"), payload(epoch=3))
    assert complete_run(str(tmp_path), latest, finished=False) == ["best.npz (epoch 3)"]
    assert json.loads(raw_entries(str(tmp_path / "best.npz"))["__meta__"].tobytes())["epoch"] == 3
