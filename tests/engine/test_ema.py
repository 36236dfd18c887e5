"""Model EMA against the closed form and a numpy loop written from e = m*e + (1-m)*p."""
import numpy as np
import pytest

import megengine as mge
import megengine.functional as F
import megengine.module as M

from basebn.engine.ema import ModelEMA, ema_should_update, pycls_momentum


class Small(M.Module):
    def __init__(self):
        super().__init__()
        self.conv = M.Conv2d(2, 3, 3, bias=True)
        self.bn = M.BatchNorm2d(3)
        self.fc = M.Linear(3, 2)

    def forward(self, x):
        return self.fc(F.mean(F.relu(self.bn(self.conv(x))), axis=(2, 3)))


def tensors(model):
    """Parameters then buffers by name (what the EMA averages)."""
    return dict(list(model.named_parameters()) + list(model.named_buffers()))


def param_names(model):
    return {n for n, _ in model.named_parameters()}


def set_value(t, value):
    t._reset(mge.tensor(np.broadcast_to(np.asarray(value, np.float32), t.shape).copy()))


def snapshot(model):
    return {n: t.numpy().astype(np.float64) for n, t in tensors(model).items()}


def test_deep_copy_in_eval_mode_and_independent():
    model = Small()
    model.train()
    ema = ModelEMA(model, 0.9)
    assert ema.module is not model and not ema.module.training and not ema.module.bn.training
    assert model.training  # the model's flag is not touched
    ema_t, model_t = tensors(ema.module), tensors(model)
    assert all(ema_t[n] is not model_t[n] for n in model_t)
    set_value(model.conv.weight, 5.0)  # changing the model does not change the EMA
    assert not np.any(ema.module.conv.weight.numpy() == 5.0)


def test_constant_parameters_follow_closed_form():
    # e_k = m^k e_0 + (1 - m^k) p for k updates from e_0 towards constant p
    model = Small()
    rng = np.random.default_rng(0)
    for t in tensors(model).values():
        set_value(t, rng.standard_normal(t.shape))
    e0 = snapshot(model)
    ema = ModelEMA(model, momentum=0.9)
    for t in tensors(model).values():
        set_value(t, rng.standard_normal(t.shape))
    p = snapshot(model)
    k = 7
    for _ in range(k):
        ema.update(model)
    got = snapshot(ema.module)
    for n in p:
        np.testing.assert_allclose(got[n], 0.9 ** k * e0[n] + (1 - 0.9 ** k) * p[n], rtol=1e-5, atol=1e-6,
                                   err_msg=n)
    assert ema.updates == k


@pytest.mark.parametrize("copy_buffers", [False, True])
def test_changing_parameters_match_numpy_loop(copy_buffers):
    rng = np.random.default_rng(1)
    model = Small()
    ema = ModelEMA(model, momentum=0.8, copy_buffers=copy_buffers)
    ref = snapshot(model)
    params = param_names(model)
    momenta = [None, 0.5, None, 0.95, 0.0, None]
    for step, mom in enumerate(momenta):
        for t in tensors(model).values():  # new parameters AND new BN statistics each step
            set_value(t, rng.standard_normal(t.shape) + step)
        ema.update(model, momentum=mom)
        m = 0.8 if mom is None else mom
        cur = snapshot(model)
        for n in ref:
            if n in params or not copy_buffers:
                ref[n] = m * ref[n] + (1 - m) * cur[n]
            else:
                ref[n] = cur[n]
        if step == 2:  # reading the module in between changes nothing
            got = snapshot(ema.module)
            for n in ref:
                np.testing.assert_allclose(got[n], ref[n], rtol=1e-5, atol=1e-6, err_msg=n)
    got = snapshot(ema.module)
    for n in ref:
        np.testing.assert_allclose(got[n], ref[n], rtol=1e-5, atol=1e-6, err_msg=n)
    if copy_buffers:  # copied bit for bit
        np.testing.assert_array_equal(ema.module.bn.running_var.numpy(), model.bn.running_var.numpy())
    else:
        assert not np.allclose(ema.module.bn.running_var.numpy(), model.bn.running_var.numpy())


def test_tracks_bn_statistics_moved_by_a_train_forward():
    # BN updates its running stats inside the forward; the EMA must see the new values
    model = Small()
    model.train()
    ema = ModelEMA(model, momentum=0.5)
    before = model.bn.running_mean.numpy().astype(np.float64)
    model(mge.tensor(np.random.default_rng(2).standard_normal((4, 2, 5, 5)).astype(np.float32) + 3))
    after = model.bn.running_mean.numpy().astype(np.float64)
    assert not np.allclose(before, after)
    ema.update(model)
    np.testing.assert_allclose(ema.module.bn.running_mean.numpy(), 0.5 * before + 0.5 * after, rtol=1e-6)


def test_integer_buffers_are_copied():
    class WithCounter(Small):
        def __init__(self):
            super().__init__()
            self.counter = mge.tensor(np.array([0], dtype=np.int32))

    model = WithCounter()
    ema = ModelEMA(model, momentum=0.9)
    model.counter._reset(mge.tensor(np.array([7], dtype=np.int32)))
    ema.update(model)
    assert ema.module.counter.dtype == np.int32 and int(ema.module.counter.numpy()[0]) == 7
    model.counter._reset(mge.tensor(np.array([9], dtype=np.int32)))
    assert int(ema.module.counter.numpy()[0]) == 7  # a copy, not the model's tensor


def test_copy_from_and_changes_to_the_module_are_kept():
    model = Small()
    ema = ModelEMA(model, momentum=0.5)
    for t in tensors(model).values():
        set_value(t, 2.0)
    ema.copy_from(model)
    assert ema.updates == 0
    assert all(np.all(t.numpy() == 2.0) for t in tensors(ema.module).values())
    # something rewrites the EMA module (precise BN on ema.module): the next update starts from it
    set_value(ema.module.bn.running_var, 10.0)
    for t in tensors(model).values():
        set_value(t, 4.0)
    ema.update(model)
    np.testing.assert_allclose(ema.module.bn.running_var.numpy(), 7.0)  # 0.5 * 10 + 0.5 * 4
    np.testing.assert_allclose(ema.module.conv.weight.numpy(), 3.0)  # 0.5 * 2 + 0.5 * 4


def test_state_dict_round_trip():
    rng = np.random.default_rng(3)
    model = Small()
    ema = ModelEMA(model, momentum=0.6)
    for _ in range(3):
        for t in tensors(model).values():
            set_value(t, rng.standard_normal(t.shape))
        ema.update(model)
    state = ema.state_dict()
    assert set(state) == {"module", "momentum", "updates"}
    assert state["momentum"] == 0.6 and state["updates"] == 3
    assert all(isinstance(v, np.ndarray) for v in state["module"].values())
    other = ModelEMA(Small(), momentum=0.1)
    other.load_state_dict(state)
    assert other.momentum == 0.6 and other.updates == 3
    a, b = snapshot(ema.module), snapshot(other.module)
    for n in a:
        np.testing.assert_array_equal(a[n], b[n], err_msg=n)
    # both continue identically
    for t in tensors(model).values():
        set_value(t, rng.standard_normal(t.shape))
    ema.update(model)
    other.update(model)
    a, b = snapshot(ema.module), snapshot(other.module)
    for n in a:
        np.testing.assert_allclose(a[n], b[n], rtol=1e-6, err_msg=n)
    # a bare module state dict loads the weights only
    third = ModelEMA(Small(), momentum=0.1)
    third.load_state_dict(state["module"])
    assert third.momentum == 0.1
    np.testing.assert_array_equal(third.module.fc.weight.numpy(), state["module"]["fc.weight"])


def test_mismatched_model_is_reported():
    ema = ModelEMA(Small(), 0.9)
    with pytest.raises(KeyError, match="no tensor"):
        ema.update(M.Linear(3, 2))


def test_pycls_momentum_value():
    # 1 - 1e-5 * 1024 / 100 * 32 = 0.9967232 (the 0.99672318 quoted for pycls is its float32 print)
    assert pycls_momentum(1e-5, 1024, 100, 32) == pytest.approx(0.99672318, abs=5e-8)
    assert pycls_momentum(1e-5, 1024, 100, 32) == pytest.approx(1 - 0.0032768, rel=1e-12)
    assert pycls_momentum(1.0, 1024, 1, 1) == 0.0  # clamped at 0
    with pytest.raises(ValueError):
        pycls_momentum(1e-5, 1024, 0, 1)


def test_schedule_start_epoch_and_period():
    # start_epoch=0 averages from the very first iteration (basecls would wait for the warm-up)
    assert ema_should_update(0, 0, 0, 1) == "update"
    assert ema_should_update(0, 0, None, 1) == "update"
    assert [ema_should_update(i, 0, 0, 3) for i in range(6)] == ["skip", "skip", "update"] * 2
    # before start_epoch the EMA mirrors the model after every iteration, whatever the period
    assert [ema_should_update(i, 1, 2, 4) for i in range(10, 14)] == ["copy"] * 4
    assert ema_should_update(5, 1, 2, 1) == "copy"
    assert ema_should_update(5, 2, 2, 1) == "update"
    # the period counts global iterations (not restarted per epoch)
    assert [ema_should_update(i, 2, 2, 4) for i in range(20, 24)] == ["skip", "skip", "skip", "update"]
    with pytest.raises(ValueError):
        ema_should_update(0, 0, 0, 0)


def test_schedule_drives_ema_as_the_hook_would():
    # 2 epochs x 3 iterations, start_epoch=1, period=2: copy x3 | update (iter 3), skip (4), update (5)
    rng = np.random.default_rng(4)
    model = Small()
    ema = ModelEMA(model, momentum=0.5)
    ref, actions = snapshot(model), []
    for it in range(6):
        for t in tensors(model).values():
            set_value(t, rng.standard_normal(t.shape))
        action = ema_should_update(it, it // 3, 1, 2)
        actions.append(action)
        cur = snapshot(model)
        if action == "update":
            ema.update(model)
            ref = {n: 0.5 * ref[n] + 0.5 * cur[n] for n in ref}
        elif action == "copy":
            ema.copy_from(model)
            ref = cur
    assert actions == ["copy", "copy", "copy", "update", "skip", "update"]
    got = snapshot(ema.module)
    for n in ref:
        np.testing.assert_allclose(got[n], ref[n], rtol=1e-5, atol=1e-6, err_msg=n)
