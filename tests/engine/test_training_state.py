"""engine/training_state.py, the one owner of training state: what a checkpoint captures is what resume restores
(model, optimizer, EMA, grad scaler, progress, best, metrics, RNG), checked against values set by hand."""
import random
from types import SimpleNamespace

import numpy as np
import pytest

import megengine as mge
import megengine.module as M
import megengine.optimizer as optim

from basebn.checkpoint import CheckpointError, final_payload, load_checkpoint, save_checkpoint
from basebn.config import load_config
from basebn.engine.build import build_trainer
from basebn.engine.ema import ModelEMA
from basebn.engine.run_record import RunRecord
from basebn.engine.training_state import capture_training_state, restore_training_state

W = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
G = np.full((4, 3), 0.25, np.float32)  # the gradient of the one step taken


def make_trainer(seed):
    mge.random.seed(seed)
    model = M.Linear(3, 4)
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return SimpleNamespace(model=model, optimizer=opt, ema=ModelEMA(model, momentum=0.5),
                           grad_scaler=mge.amp.GradScaler(), progress=SimpleNamespace(epoch=1),
                           record=RunRecord(),
                           cfg=SimpleNamespace(to_dict=lambda: {"solver": {"max_epoch": 5}}))


def trained_trainer():
    t = make_trainer(0)
    t.model.weight._reset(mge.tensor(W))
    t.model.weight.grad = mge.tensor(G)
    t.model.bias.grad = mge.tensor(np.zeros(4, np.float32))
    t.optimizer.step()  # first SGD step with momentum: buffer = gradient
    t.optimizer.param_groups[0]["lr"] = 0.025
    t.ema.copy_from(t.model)
    t.grad_scaler.scale_factor, t.grad_scaler._growth_tracker = 512.0, 7
    t.progress.epoch, t.record.best_top1, t.record.best_epoch = 3, 71.25, 2
    t.record.last_metrics = {"epoch": 3, "top1": 70.5}
    return t


def test_capture_then_restore_through_a_file(tmp_path):
    t = trained_trainer()
    np.random.seed(11)
    random.seed(12)
    save_checkpoint(str(tmp_path / "latest.npz"), capture_training_state(t))
    expected_np, expected_py = np.random.rand(3), random.random()  # what the RNGs give after the checkpoint
    np.random.seed(0)
    random.seed(0)

    fresh = make_trainer(1)
    epoch = restore_training_state(fresh, load_checkpoint(str(tmp_path / "latest.npz")), source="latest.npz")
    assert epoch == 3
    np.testing.assert_allclose(fresh.model.weight.numpy(), W - 0.1 * G, rtol=1e-6)
    np.testing.assert_allclose(fresh.ema.module.weight.numpy(), W - 0.1 * G, rtol=1e-6)
    state = fresh.optimizer.state_dict()
    assert state["param_groups"][0]["lr"] == 0.025
    buffers = [s["momentum_buffer"] for s in state["state"].values()]
    assert any(np.array_equal(b, G) for b in buffers)
    assert fresh.grad_scaler.scale_factor == 512.0 and fresh.grad_scaler._growth_tracker == 7
    assert (fresh.record.best_top1, fresh.record.best_epoch, fresh.record.last_metrics) == (
        71.25, 2, {"epoch": 3, "top1": 70.5})
    np.testing.assert_array_equal(np.random.rand(3), expected_np)
    assert random.random() == expected_py


def test_restoring_a_final_checkpoint_says_what_is_missing(tmp_path):
    path = str(tmp_path / "latest.npz")
    save_checkpoint(path, final_payload(capture_training_state(trained_trainer())))
    with pytest.raises(CheckpointError, match="no optimizer/progress state"):
        restore_training_state(make_trainer(1), load_checkpoint(path), source=path)


def test_trainer_declares_its_evaluation_state(tmp_path):
    cfg_file = tmp_path / "c.py"
    cfg_file.write_text("from basebn.config import BaseConfig\nclass Cfg(BaseConfig):\n    pass\n")
    model = M.Linear(3, 4)
    t = build_trainer(load_config(str(cfg_file)), model, [None] * 3, optim.SGD(model.parameters(), lr=0.1))
    assert (t.record.best_top1, t.record.best_epoch, t.record.last_metrics) == (None, None, None)
