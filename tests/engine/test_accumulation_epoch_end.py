"""Gradient accumulation at the epoch end: an optimizer step never spans an epoch. With accumulation_steps not
dividing the epoch, its last step averages the micro-batches left; with accumulation_steps larger than the epoch,
each epoch is one step of all its micro-batches (and a warning says so), never a run without a step. Reference:
float64 numpy SGD on softmax cross-entropy from the math."""
import numpy as np
import pytest
from loguru import logger

import megengine.module as M
import megengine.optimizer as optim
from megengine.autodiff import GradManager

from basebn.engine.losses import CrossEntropyLoss
from basebn.engine.trainer import ClsTrainer
from tests.support.batches import FixedBatches
from tests.support.linear_reference import C, D, ce_grad, random_batches

LR = 0.5


def _reference(w, b, batches, accum, epochs):
    """Each epoch cut into steps of `accum` batches from its start, the last one shorter; a step's gradient is the
    mean over its batches."""
    w, b = w.astype(np.float64), b.astype(np.float64)
    for _ in range(epochs):
        for start in range(0, len(batches), accum):
            step = batches[start:start + accum]
            grads = [ce_grad(w, b, x.astype(np.float64), y) for x, y in step]
            w = w - LR * sum(g[0] for g in grads) / len(step)
            b = b - LR * sum(g[1] for g in grads) / len(step)
    return w, b


@pytest.mark.parametrize("accum", [3, 8])  # 5 iterations per epoch: 3 + 2; 8 > 5: one step of 5 per epoch
def test_last_step_of_an_epoch_averages_the_micro_batches_left(accum):
    batches = random_batches(5)
    model = M.Linear(D, C)
    w0, b0 = model.weight.numpy().copy(), model.bias.numpy().copy()
    warnings = []
    sink = logger.add(lambda m: warnings.append(m.record["message"]), level="WARNING")
    try:
        trainer = ClsTrainer(model, FixedBatches(batches), optim.SGD(model.parameters(), lr=LR),
                             GradManager().attach(model.parameters()), CrossEntropyLoss(), accumulation_steps=accum)
        trainer.train(start_info=[1, 1], max_info=[2, len(batches)])
    finally:
        logger.remove(sink)
    w, b = _reference(w0, b0, batches, accum, epochs=2)
    np.testing.assert_allclose(model.weight.numpy(), w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model.bias.numpy(), b, rtol=1e-5, atol=1e-6)
    expected = ([] if accum <= 5 else
                ["accumulation_steps=8 is more than the 5 iterations of an epoch: each optimizer step accumulates "
                 "the 5 micro-batches of its epoch (an optimizer step never spans epochs)"])
    assert warnings == expected
