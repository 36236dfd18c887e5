"""A non-finite gradient skips the optimizer step (the AMP rule): a NaN pixel through BN -> ReLU (MegEngine's
relu(nan) is 0, so the loss stays finite) leaves the weights, the optimizer state, the EMA and every BN running
buffer bit for bit as they were, with and without accumulation, and a fixed-scale grad scaler (which unscales
without looking) too; the next finite step moves them. Too many skips in a row stop the run; a checkpoint payload
holding NaN is never written; a NaN loss still stops the run at the loss check. References: the state captured
before the step, numpy's isfinite."""
import os

import numpy as np
import pytest

import megengine as mge
import megengine.functional as F
import megengine.module as M
from megengine.autodiff import GradManager
from basecore.engine import BaseHook

from basebn.config import BaseConfig
from basebn.engine.ema import ModelEMA
from basebn.engine.hooks import CheckpointHook, EMAHook
from basebn.engine.losses import CrossEntropyLoss
from basebn.engine.optimizer import InplaceSGD
from basebn.engine.run_record import RunRecord
from basebn.engine.trainer import (ClsTrainer, NonFiniteGradientError, NonFiniteLossError, NonFiniteStateError,
                                   all_finite)
from basebn.engine.training_state import capture_training_state, nonfinite_arrays, optimizer_state
from basebn.layers import BatchNorm2d, BatchNormAct2d, BatchRenorm2d, accumulate_bn_stats
from basebn.layers.bn_guard import restore_running_stats, running_stats_layers, snapshot_running_stats
from basebn.ops.bn_ops import use_backend
from tests.support.batches import FixedBatches


class _Net(M.Module):
    """bn1 sees the NaN (its guard keeps its buffers); after the ReLU bn2 sees finite values, so only the
    rollback keeps its buffers; bn1.weight's gradient is NaN."""

    def __init__(self):
        super().__init__()
        self.bn1 = BatchNorm2d(2)
        self.bn2 = BatchNorm2d(2)
        self.fc = M.Linear(2 * 3 * 3, 3)

    def forward(self, x):
        return self.fc(F.flatten(self.bn2(F.relu(self.bn1(x))), 1))


def _batch(seed, nan=False):
    rng = np.random.RandomState(seed)
    x = (rng.randn(4, 2, 3, 3) + seed).astype(np.float32)
    if nan:
        x[1, 0, 2, 1] = np.nan
    return x, rng.randint(0, 3, 4).astype(np.int32)


def _state(trainer):
    """Every number a skipped step must leave alone: weights and BN buffers, optimizer state, EMA."""
    t = trainer
    out = {f"model/{k}": np.array(v) for k, v in t.model.state_dict().items()}
    out.update({f"opt/{i}": np.array(v) for i, v in enumerate(_leaves(optimizer_state(t.optimizer)))})
    out.update({f"ema/{k}": np.array(v) for k, v in t.ema.state_dict()["module"].items()})
    return out


def _leaves(obj):
    if isinstance(obj, dict):
        return [x for k in sorted(obj, key=str) for x in _leaves(obj[k])]
    if isinstance(obj, (list, tuple)):
        return [x for v in obj for x in _leaves(v)]
    return [obj] if isinstance(obj, np.ndarray) else []


class _Record(BaseHook):
    """The state after every iteration's hooks (EMA included), and whether its step was skipped."""

    priority = 90

    def __init__(self):
        self.states, self.skipped = [], []

    def after_iter(self):
        self.states.append(_state(self.trainer))
        self.skipped.append(self.trainer.step_skipped)


def _train(batches, accum=1, aware=True, grad_scaler=None, max_skips=25):
    """Train one epoch of `batches`; the EMA averages once per optimizer step (update_period = accum)."""
    model = _Net()
    ema = ModelEMA(model, momentum=0.5)
    record = _Record()
    opt = InplaceSGD(model.parameters(), lr=0.1, momentum=0.9)
    trainer = ClsTrainer(model, FixedBatches(batches), opt, GradManager().attach(model.parameters()),
                         CrossEntropyLoss(), hooks=[EMAHook(0, accum), record], ema=ema, grad_scaler=grad_scaler,
                         accumulation_steps=accum, bn_accumulation_aware=aware, max_consecutive_skips=max_skips)
    before = _state(trainer)
    trainer.train(start_info=[1, 1], max_info=[1, len(batches)])
    return trainer, [before] + record.states, record.skipped


def _same(a, b):
    assert sorted(a) == sorted(b)
    return [k for k in a if a[k].tobytes() != b[k].tobytes()]


@pytest.mark.parametrize("accum, aware, scaler", [(1, True, None), (2, True, None), (2, False, None),
                                                  (1, True, "fixed")])
def test_nan_gradient_skips_the_step_and_keeps_every_state_bit_for_bit(accum, aware, scaler):
    # accum 1: steps [a] [nan] [b]; accum 2: steps [a, c] [d, nan] [b, e]
    first = [_batch(1)] if accum == 1 else [_batch(1), _batch(3)]
    bad = [_batch(2, nan=True)] if accum == 1 else [_batch(4), _batch(2, nan=True)]
    last = [_batch(5)] if accum == 1 else [_batch(5), _batch(6)]
    grad_scaler = mge.amp.GradScaler(init_scale=8.0, growth_interval=0) if scaler == "fixed" else None
    trainer, states, skipped = _train(first + bad + last, accum, aware, grad_scaler)
    k = accum  # states[k]: after the first step; states[2k]: after the skipped one
    assert skipped == [False] * (2 * accum - 1) + [True] + [False] * accum
    assert trainer.skipped_steps == 1
    assert _same(states[k], states[2 * k]) == []
    assert all(np.isfinite(a).all() for a in states[-1].values())
    # the finite steps around it do move the weights, momentum, EMA and both layers' buffers
    for before, after in ((states[0], states[k]), (states[2 * k], states[3 * k])):
        moved = _same(before, after)
        for key in ("model/fc.weight", "model/bn1.weight", "model/bn1.running_mean", "model/bn2.running_var",
                    "ema/fc.weight", "ema/bn2.running_mean", "opt/0"):
            assert key in moved, key


@pytest.mark.parametrize("backend", ["kernel", "fallback"])
@pytest.mark.parametrize("make", [lambda: BatchNorm2d(3), lambda: BatchNormAct2d(3), lambda: BatchRenorm2d(3),
                                  lambda: BatchNorm2d(3, momentum=None), lambda: M.BatchNorm2d(3)],
                         ids=["bn", "bn_act", "brn", "cumulative", "megengine_bn"])
def test_rollback_snapshot_survives_every_bn_update_path(make, backend):
    """The snapshot holds handles, not copies: no training forward may write into a running buffer in place."""
    rng = np.random.RandomState(0)
    x = [mge.tensor(rng.randn(4, 3, 5, 5).astype(np.float32) * (i + 1) + i) for i in range(3)]
    model = M.Sequential(make())
    model.train()
    with use_backend(backend):
        model(x[0])  # buffers away from their initial values first
        before = [(np.array(m.running_mean), np.array(m.running_var)) for m in running_stats_layers(model)]
        snapshot = snapshot_running_stats(model)
        model(x[1])
        with accumulate_bn_stats(model):
            model(x[2])
    bn = running_stats_layers(model)[0]
    assert not np.array_equal(np.array(bn.running_mean), before[0][0])  # the forwards did move them
    restore_running_stats(snapshot)
    after = [(np.array(m.running_mean), np.array(m.running_var)) for m in running_stats_layers(model)]
    assert len(after) == 1
    for (m0, v0), (m1, v1) in zip(before, after):
        assert m0.tobytes() == m1.tobytes() and v0.tobytes() == v1.tobytes()


def test_consecutive_skips_stop_the_run_with_one_line():
    batches = [_batch(1), _batch(2, nan=True), _batch(3, nan=True), _batch(4, nan=True)]
    with pytest.raises(NonFiniteGradientError) as info:
        _train(batches, max_skips=2)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith("2 optimizer steps in a row skipped (non-finite gradients), the last at epoch 1 "
                          "iteration 3 (global iteration 2)")


def test_nan_loss_still_stops_the_run_before_its_step():
    model = M.Linear(2 * 3 * 3, 3)  # no ReLU: the NaN pixel reaches the loss
    w = model.weight.numpy().copy()
    batches = [(x.reshape(4, -1), y) for x, y in (_batch(1, nan=True), _batch(2))]
    trainer = ClsTrainer(model, FixedBatches(batches), InplaceSGD(model.parameters(), lr=0.1, momentum=0.9),
                         GradManager().attach(model.parameters()), CrossEntropyLoss())
    with pytest.raises(NonFiniteLossError, match=r"^loss is nan at epoch 1 iteration 1 "):
        trainer.train(start_info=[1, 1], max_info=[1, 2])
    assert model.weight.numpy().tobytes() == w.tobytes()


def test_all_finite_is_numpy_isfinite_and_leaves_the_tensors_alone():
    rng = np.random.RandomState(0)
    # grouped for concatenation: two norm-like vectors, two convs of one width, a bias; alone: a large tensor,
    # a 0-d one
    shapes = [(1, 4, 1, 1), (1, 6, 1, 1), (4, 3, 3, 3), (6, 3, 3, 3), (5,), (70000,), ()]
    arrays = [np.asarray(rng.randn(*shape), np.float32) for shape in shapes]
    cases = [(None, None)] + [(i, bad) for i in range(len(shapes)) for bad in (np.nan, np.inf, -np.inf)]
    for index, bad in cases:
        values = [a.copy() for a in arrays]
        if index is not None:
            values[index].reshape(-1)[values[index].size // 2] = bad
        tensors = [mge.tensor(v) for v in values]
        assert all_finite(tensors) == all(np.isfinite(v).all() for v in values), (index, bad)
        for t, v in zip(tensors, values):
            assert t.numpy().tobytes() == v.tobytes()
    assert all_finite([])
    # a sum past float32's range counts as non-finite (documented: only values near 1e38 get there)
    assert not all_finite([mge.tensor(np.full((4,), 3e38, np.float32))])


def test_checkpoint_with_nan_weights_or_ema_is_not_written(tmp_path):
    model = _Net()
    ema = ModelEMA(model, momentum=0.5)
    trainer = ClsTrainer(model, FixedBatches([_batch(1)]), InplaceSGD(model.parameters(), lr=0.1, momentum=0.9),
                         GradManager().attach(model.parameters()), CrossEntropyLoss(), ema=ema,
                         config=BaseConfig())
    trainer.progress.update({"epoch": 1, "max_epoch": 1})
    assert nonfinite_arrays(capture_training_state(trainer)) == []
    hook = CheckpointHook(str(tmp_path), 1, RunRecord())
    hook.trainer = trainer
    ema.module.fc.weight[...] = F.full(ema.module.fc.weight.shape, np.nan)
    with pytest.raises(NonFiniteStateError, match=r"^the checkpoint of epoch 1 would hold NaN/inf values in "
                                                   r"ema/fc.weight; not written"):
        hook.after_epoch()
    model.bn1.weight[...] = F.full((2,), np.inf)
    with pytest.raises(NonFiniteStateError, match=r"^final.npz would hold NaN/inf values in model/bn1.weight, "
                                                   r"ema/fc.weight; not written"):
        hook.after_train()
    assert os.listdir(tmp_path) == []
