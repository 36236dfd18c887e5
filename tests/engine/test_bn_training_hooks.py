"""BN in training through the trainer and its hooks: accumulation-aware statistics (one update per optimizer
step = the concatenated batch; off = one per micro-batch), the grad-scaler skip rollback, the Batch
Renormalization schedule hook, the non-finite report, and bn.freeze_last_epochs on a tiny synthetic run
(the BN buffers of the checkpoint at the freeze point equal final.npz's while the weights still change).
References: float64 numpy of the momentum rule over the batches the loader yields; the run's own earlier
checkpoint for the freeze."""
import os
from types import SimpleNamespace

import numpy as np
import pytest

import megengine as mge
import megengine.functional as F
import megengine.module as M
import megengine.optimizer as optim
from megengine.autodiff import GradManager

from basebn.checkpoint import load_checkpoint
from basebn.config import BaseConfig
from basebn.engine.bn_hooks import BatchRenormHook, FreezeBNHook, NonFiniteBNHook, freeze_start_epoch
from basebn.engine.build import build_data, build_train_data, build_train_model, build_trainer, scaled_base_lr
from basebn.engine.hooks import default_hooks
from basebn.engine.optimizer import build_optimizer
from basebn.engine.run_record import RunRecord
from basebn.engine.trainer import ClsTrainer
from basebn.layers import BatchNorm2d, BatchRenorm2d
from basebn.train import seed_all

MOM = 0.9


class _Loader:
    """Fixed batches of (images, int labels), the same every epoch."""

    def __init__(self, batches):
        self.batches = batches

    def __len__(self):
        return len(self.batches)

    def __iter__(self):
        return iter(self.batches)

    def set_epoch(self, epoch):
        pass


class _Net(M.Module):
    def __init__(self):
        super().__init__()
        self.bn = BatchNorm2d(2)
        self.fc = M.Linear(2 * 3 * 3, 3)

    def forward(self, x):
        return self.fc(F.flatten(self.bn(x), 1))


def _batches(sizes, seed=0):
    rng = np.random.RandomState(seed)
    return [((rng.randn(n, 2, 3, 3) * (1 + i) + i).astype(np.float32), rng.randint(0, 3, n).astype(np.int32))
            for i, n in enumerate(sizes)]


def _trainer(model, batches, accum, aware=True, grad_scaler=None):
    opt = optim.SGD(model.parameters(), lr=0.01)
    return ClsTrainer(model, _Loader(batches), opt, GradManager().attach(model.parameters()),
                      lambda logits, labels: F.loss.cross_entropy(logits, labels), grad_scaler=grad_scaler,
                      accumulation_steps=accum, bn_accumulation_aware=aware)


def _moments(x):
    x = np.asarray(x, np.float64)
    n = x.shape[0] * x.shape[2] * x.shape[3]
    mean = x.mean(axis=(0, 2, 3))
    return mean, ((x - mean.reshape(1, -1, 1, 1)) ** 2).sum(axis=(0, 2, 3)) / (n - 1)


def _buffers(bn):
    return bn.running_mean.numpy().ravel().copy(), bn.running_var.numpy().ravel().copy()


@pytest.mark.parametrize("aware", [True, False])
def test_trainer_accumulation_aware_statistics(aware):
    batches = _batches([3, 4, 5, 2, 4, 4])  # two optimizer steps of 3 micro-batches
    model = _Net()
    _trainer(model, batches, accum=3, aware=aware).train(start_info=[1, 1], max_info=[1, len(batches)])
    rm, rv = np.zeros(2), np.ones(2)
    if aware:
        for step in (batches[:3], batches[3:]):
            mean, var = _moments(np.concatenate([b[0] for b in step]))
            rm, rv = MOM * rm + (1 - MOM) * mean, MOM * rv + (1 - MOM) * var
    else:
        for images, _ in batches:
            mean, var = _moments(images)
            rm, rv = MOM * rm + (1 - MOM) * mean, MOM * rv + (1 - MOM) * var
    np.testing.assert_allclose(_buffers(model.bn)[0], rm, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_buffers(model.bn)[1], rv, rtol=1e-5)


def test_trainer_accumulation_window_closes_at_the_epoch_end():
    batches = _batches([3, 4, 5])  # 3 iterations per epoch, accumulation 2: the last window is cut by the epoch
    model = _Net()
    _trainer(model, batches, accum=2).train(start_info=[1, 1], max_info=[1, len(batches)])
    rm = np.zeros(2)
    for part in (batches[:2], batches[2:]):
        rm = MOM * rm + (1 - MOM) * _moments(np.concatenate([b[0] for b in part]))[0]
    np.testing.assert_allclose(_buffers(model.bn)[0], rm, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("accum", [1, 2])
def test_skipped_step_rolls_back_bn_statistics(accum):
    """The grad scaler's overflow check forced on CPU: the skipped step leaves weights and BN buffers as
    they were; the same run without the forced overflow moves both."""
    batches = _batches([4] * accum)
    results = []
    for overflow in (True, False):
        model = _Net()
        before = _buffers(model.bn), model.fc.weight.numpy().copy()
        scaler = mge.amp.GradScaler(init_scale=4.0, growth_interval=1)
        scaler._check_gradients = lambda grads, scale, flag=overflow: flag
        _trainer(model, batches, accum=accum, grad_scaler=scaler).train(start_info=[1, 1],
                                                                          max_info=[1, len(batches)])
        results.append((before, (_buffers(model.bn), model.fc.weight.numpy()), scaler.scale_factor))
    (before, after, scale) = results[0]
    assert scale == 2.0  # the scaler did see an overflow and backed off
    for a, b in zip(before[0] + (before[1],), after[0] + (after[1],)):
        assert a.tobytes() == b.tobytes()
    before, after, _ = results[1]
    assert not np.array_equal(before[0][0], after[0][0]) and not np.array_equal(before[1], after[1])


def _fake_trainer(model, epoch=1, global_iter=0, iters_per_epoch=10):
    return SimpleNamespace(model=model, progress=SimpleNamespace(epoch=epoch, max_epoch=3), global_iter=global_iter,
                           iters_per_epoch=iters_per_epoch, ema=None)


def test_nonfinite_hook_reports_layer_and_count_once():
    model = _Net()
    hook = NonFiniteBNHook()
    hook.trainer = _fake_trainer(model)
    x = np.ones((2, 2, 3, 3), np.float32)
    x[0, 0, 0, 0] = np.inf
    model(mge.tensor(x))
    model(mge.tensor(x))
    hook.after_epoch()
    assert hook.metrics() == {"bn_nonfinite": {"bn": 2}}
    assert hook.metrics() == {}
    hook.after_epoch()  # nothing new
    assert hook.metrics() == {}


def test_batch_renorm_hook_follows_the_schedule():
    model = M.Sequential(BatchRenorm2d(2))
    hook = BatchRenormHook(3.0, 5.0, 1, 2)
    for it, want in ((5, (1.0, 0.0)), (20, (2.0, 2.5)), (40, (3.0, 5.0))):
        hook.trainer = _fake_trainer(model, global_iter=it)
        hook.before_iter()
        assert (model[0].r_max, model[0].d_max) == pytest.approx(want)


def test_freeze_hook_puts_bn_in_eval_from_the_start_epoch():
    model = _Net()
    hook = FreezeBNHook(freeze_start_epoch(3, 1))
    for epoch, frozen in ((1, False), (2, False), (3, True)):
        model.train()
        hook.trainer = _fake_trainer(model, epoch=epoch)
        hook.before_epoch()
        assert model.bn.training is (not frozen) and model.fc.training
    assert freeze_start_epoch(10, 0) == float("inf")


EPOCHS = 3


def _tiny_run(run_dir, freeze, precise):
    cfg = BaseConfig()
    cfg.merge(dict(batch_size=16, seed=5, output_dir=run_dir,
                   data=dict(name="synthetic", image_size=8, train_size=48, test_size=32, pad=1, prefetch=False,
                             num_workers=0),
                   model=dict(name="resnet20", base_width=2), solver=dict(max_epoch=EPOCHS, warmup_epochs=0),
                   eval_every_n_epoch=1, save_every_n_epoch=1, log_every_n_iter=10,
                   bn=dict(freeze_last_epochs=freeze, precise_every_n_epoch=1 if precise else float("inf"),
                           num_samples_precise=32)))
    os.makedirs(run_dir)
    seed_all(cfg.seed)
    train_ds, train_loader = build_train_data(cfg)
    _, test_loader = build_data(cfg, train=False)
    model = build_train_model(cfg, train_ds)
    optimizer = build_optimizer(model, cfg.solver, scaled_base_lr(cfg))
    record = RunRecord()
    precise_loader = build_data(cfg.clone().merge({"seed": cfg.seed + 1}), train=True)[1] if precise else None
    hooks = default_hooks(cfg, scaled_base_lr(cfg), run_dir, test_loader, precise_loader, record)
    trainer = build_trainer(cfg, model, train_loader, optimizer, hooks, record=record)
    trainer.train(start_info=[1, 1], max_info=[EPOCHS, len(train_loader)])


def _split(state):
    buffers = {k: v for k, v in state.items() if k.endswith(("running_mean", "running_var"))}
    weights = {k: v for k, v in state.items() if k.endswith(("weight", "bias"))}
    return buffers, weights


@pytest.mark.parametrize("precise", [False, True])
def test_freeze_last_epochs_keeps_buffers_while_weights_train(tmp_path, precise):
    run = str(tmp_path / "run")
    _tiny_run(run, freeze=2, precise=precise)  # epochs 2 and 3 frozen
    ckpt = {e: _split(load_checkpoint(os.path.join(run, f"epoch_{e}.npz"))["model"]) for e in (1, 2)}
    final = _split(load_checkpoint(os.path.join(run, "final.npz"))["model"])
    for k, v in final[0].items():  # buffers: fixed from the freeze point on
        np.testing.assert_array_equal(ckpt[2][0][k], v, err_msg=k)
    if not precise:  # without precise BN the freeze point is the end of epoch 1
        for k, v in final[0].items():
            np.testing.assert_array_equal(ckpt[1][0][k], v, err_msg=k)
    else:  # precise BN ran at the start of epoch 2: the buffers differ from epoch 1's
        assert any(not np.array_equal(ckpt[1][0][k], v) for k, v in final[0].items())
    assert any(not np.array_equal(ckpt[2][1][k], v) for k, v in final[1].items())  # the weights still train
