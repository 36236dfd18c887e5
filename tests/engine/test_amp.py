"""Loss scaling in the trainer (AMP's arithmetic; it needs no GPU): one unscale and one scale update per
optimizer step, accumulated gradients unscaled once, overflow skips the step. Reference: numpy from the math."""
import numpy as np
import pytest

import megengine.module as M
import megengine.optimizer as optim
from megengine.amp import GradScaler
from megengine.autodiff import GradManager

from basebn.engine.losses import CrossEntropyLoss
from basebn.engine.trainer import ClsTrainer
from tests.support.batches import FixedBatches
from tests.support.linear_reference import C, D, ce_grad, random_batches



def _trainer(batches, scaler, accum, lr=0.1):
    model = M.Linear(D, C)
    opt = optim.SGD(model.parameters(), lr=lr)
    gm = GradManager().attach(model.parameters())
    return ClsTrainer(model, FixedBatches(batches), opt, gm, CrossEntropyLoss(), hooks=[], grad_scaler=scaler,
                      accumulation_steps=accum), model


def _reference(w, b, batches, accum, lr=0.1):
    w, b = w.astype(np.float64), b.astype(np.float64)
    for start in range(0, len(batches), accum):
        gw, gb = np.zeros_like(w), np.zeros_like(b)
        for x, y in batches[start:start + accum]:
            dw, db = ce_grad(w, b, x.astype(np.float64), y)
            gw += dw / accum
            gb += db / accum
        w, b = w - lr * gw, b - lr * gb
    return w, b


@pytest.mark.parametrize("accum", [1, 2, 3])
def test_accumulated_gradients_are_unscaled_once(accum):
    batches = random_batches(2 * accum)
    trainer, model = _trainer(batches, GradScaler(init_scale=1024.0, growth_interval=0), accum)
    w0, b0 = model.weight.numpy().copy(), model.bias.numpy().copy()
    trainer.train(start_info=[1, 1], max_info=[1, len(batches)])
    w, b = _reference(w0, b0, batches, accum)
    np.testing.assert_allclose(model.weight.numpy(), w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model.bias.numpy(), b, rtol=1e-5, atol=1e-6)


def test_dynamic_scale_advances_once_per_optimizer_step():
    # growth_interval 2 and 4 optimizer steps (8 iterations, accumulation 2): the scale doubles after
    # optimizer steps 2 and 4 only -> 4 * 2 * 2 = 16 (counting twice per step would give 64)
    batches = random_batches(8)
    scaler = GradScaler(init_scale=4.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=2)
    trainer, model = _trainer(batches, scaler, accum=2)
    w0, b0 = model.weight.numpy().copy(), model.bias.numpy().copy()
    trainer.train(start_info=[1, 1], max_info=[1, 8])
    assert scaler.scale_factor == 16.0 and scaler._growth_tracker == 0
    w, b = _reference(w0, b0, batches, 2)
    np.testing.assert_allclose(model.weight.numpy(), w, rtol=1e-5, atol=1e-6)


def test_overflow_skips_the_step_and_backs_off():
    batches = [(x * 1e4, y) for x, y in random_batches(2)]  # |dW| ~ 1e4: times 2**120 it overflows float32
    scaler = GradScaler(init_scale=2.0 ** 120, growth_factor=2.0, backoff_factor=0.5, growth_interval=1000)
    trainer, model = _trainer(batches, scaler, accum=2)
    w0 = model.weight.numpy().copy()
    trainer.train(start_info=[1, 1], max_info=[1, 2])
    np.testing.assert_array_equal(model.weight.numpy(), w0)  # scaled gradients overflowed float32: no step
    assert scaler.scale_factor == 2.0 ** 119 and scaler._growth_tracker == 0


def test_no_scaler_is_plain_sgd():
    batches = random_batches(4)
    trainer, model = _trainer(batches, None, accum=2)
    w0, b0 = model.weight.numpy().copy(), model.bias.numpy().copy()
    trainer.train(start_info=[1, 1], max_info=[1, 4])
    w, _ = _reference(w0, b0, batches, 2)
    np.testing.assert_allclose(model.weight.numpy(), w, rtol=1e-5, atol=1e-6)
