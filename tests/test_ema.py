"""Model EMA against the closed form and a numpy loop written from e = m*e + (1-m)*p."""
import numpy as np
import pytest

import megengine as mge
import megengine.module as M

from basebn.engine.ema import ModelEMA, ema_should_update, pycls_momentum


def small_model():
    return M.Sequential(M.Conv2d(2, 3, 3, bias=True), M.BatchNorm2d(3), M.Linear(4, 2))


def set_all(model, values):
    for (name, t), v in zip(list(model.named_parameters()) + list(model.named_buffers()), values):
        t._reset(mge.tensor(np.full(t.shape, v, dtype=np.float32)))


def test_constant_parameters_follow_closed_form():
    model = small_model()
    set_all(model, [0.0] * 8)
    ema = ModelEMA(model, momentum=0.9)
    set_all(model, [1.0] * 8)
    for _ in range(5):
        ema.update(model)
    # e_k = m^k e_0 + (1 - m^k) p with e_0 = 0, p = 1
    for name, t in list(ema.module.named_parameters()) + list(ema.module.named_buffers()):
        np.testing.assert_allclose(t.numpy(), 1 - 0.9 ** 5, rtol=1e-6, err_msg=name)


def test_changing_parameters_match_numpy_loop_and_copy_buffers():
    rng = np.random.default_rng(0)
    model = small_model()
    ema = ModelEMA(model, momentum=0.7, copy_buffers=True)
    names = [n for n, _ in model.named_parameters()]
    ref = {n: np.asarray(t.numpy(), np.float64) for n, t in model.named_parameters()}
    for step in range(4):
        for n, p in model.named_parameters():
            p._reset(mge.tensor(rng.standard_normal(p.shape).astype(np.float32)))
        model[1].running_mean._reset(mge.tensor(np.full((1, 3, 1, 1), step, np.float32)))
        m = 0.7 if step % 2 else 0.5
        ema.update(model, momentum=None if step % 2 else 0.5)
        params = dict(model.named_parameters())
        for n in names:
            ref[n] = m * ref[n] + (1 - m) * params[n].numpy()
    got = dict(ema.module.named_parameters())
    for n in names:
        np.testing.assert_allclose(got[n].numpy(), ref[n], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(ema.module[1].running_mean.numpy(), np.full((1, 3, 1, 1), 3))  # copied


def test_copy_from_and_state_dict_round_trip():
    model = small_model()
    ema = ModelEMA(model, momentum=0.5)
    set_all(model, [2.0] * 8)
    ema.copy_from(model)
    assert all(np.all(t.numpy() == 2.0) for _, t in ema.module.named_parameters())
    ema.update(model)
    state = ema.state_dict()
    other = ModelEMA(small_model(), momentum=0.1)
    other.load_state_dict(state)
    assert other.momentum == 0.5 and other.updates == 1
    for (n, a), (_, b) in zip(ema.module.named_parameters(), other.module.named_parameters()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_pycls_momentum_value():
    assert pycls_momentum(1e-5, 1024, 100, 32) == pytest.approx(0.99672318)
    assert pycls_momentum(1.0, 1024, 1, 1) == 0.0


def test_schedule_start_epoch_and_period():
    # start_epoch=0 averages from the very first iteration (basecls would wait for warm-up)
    assert ema_should_update(0, 0, 0, 1) == "update"
    assert [ema_should_update(i, 0, 0, 3) for i in range(6)] == ["skip", "skip", "update"] * 2
    assert ema_should_update(5, 1, 2, 1) == "copy"
    assert ema_should_update(5, 2, 2, 1) == "update"
