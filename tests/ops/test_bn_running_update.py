"""bn_running_update (kernel and fallback) against numpy written from the formula in float32, bit for bit: a finite
batch moves the running statistics, a non-finite one leaves them untouched and is counted; BatchNorm2d's guard
reports the count through take_nonfinite_counts on both paths."""
import numpy as np
import pytest

import megengine as mge

from basebn.ops import bn_ops
from basebn.layers.batch_norm import BatchNorm2d
from basebn.layers.bn_guard import apply_running_update, take_nonfinite_counts
from basebn.ops.kernel_library import kernel_available

BACKENDS = ["fallback", pytest.param("kernel", marks=pytest.mark.skipif(not kernel_available(),
                                                                          reason="BN kernels not built"))]


def numpy_update(rm, rv, m, v, keep):
    """float32 products and sum, each rounded as numpy's float32 arithmetic rounds it."""
    k, k1 = np.float32(keep), np.float32(1.0 - keep)
    return rm * k + m * k1, rv * k + v * k1


def _t(a):
    return mge.tensor(np.asarray(a))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", [(7,), (1, 300, 1, 1)])
@pytest.mark.parametrize("keep", [0.9, 0.1, 0.997])
def test_a_finite_batch_moves_the_running_statistics_bit_for_bit(backend, shape, keep):
    rng = np.random.default_rng(0)
    rm, m = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
    rv, v = (rng.random(shape).astype(np.float32) + 0.5 for _ in range(2))
    with bn_ops.use_backend(backend):
        new_m, new_v, bad = bn_ops.bn_running_update(_t(rm), _t(rv), _t(m), _t(v), keep, _t(np.zeros(1, np.int32)))
    want_m, want_v = numpy_update(rm, rv, m, v, keep)
    np.testing.assert_array_equal(new_m.numpy(), want_m)
    np.testing.assert_array_equal(new_v.numpy(), want_v)
    assert tuple(new_m.shape) == shape and bad.numpy().tolist() == [0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_per_channel_batch_values_update_running_statistics_of_another_shape(backend):
    """(C,) batch values against MegEngine's (1, C, 1, 1) buffers: the result keeps the buffers' shape; a batch with
    another number of values is refused with a ValueError naming the shapes."""
    rng = np.random.default_rng(6)
    rm, rv = rng.standard_normal((1, 6, 1, 1)).astype(np.float32), rng.random((1, 6, 1, 1)).astype(np.float32) + 0.5
    m, v = rng.standard_normal(6).astype(np.float32), rng.random(6).astype(np.float32) + 0.5
    with bn_ops.use_backend(backend):
        new_m, new_v, _ = bn_ops.bn_running_update(_t(rm), _t(rv), _t(m), _t(v), 0.9, _t(np.zeros(1, np.int32)))
        with pytest.raises(ValueError, match=r"mean has shape \(5,\)"):
            bn_ops.bn_running_update(_t(rm), _t(rv), _t(m[:5]), _t(v), 0.9, _t(np.zeros(1, np.int32)))
    want_m, want_v = numpy_update(rm.reshape(6), rv.reshape(6), m, v, 0.9)
    assert tuple(new_m.shape) == tuple(new_v.shape) == (1, 6, 1, 1)
    np.testing.assert_array_equal(new_m.numpy().reshape(6), want_m)
    np.testing.assert_array_equal(new_v.numpy().reshape(6), want_v)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bad_value", ["nan_mean", "inf_var", "neg_inf_mean"])
def test_a_non_finite_batch_keeps_the_statistics_and_is_counted(backend, bad_value):
    rng = np.random.default_rng(1)
    rm, m = (rng.standard_normal(5).astype(np.float32) for _ in range(2))
    rv, v = (rng.random(5).astype(np.float32) + 0.5 for _ in range(2))
    {"nan_mean": m, "inf_var": v, "neg_inf_mean": m}[bad_value][3] = {"nan_mean": np.nan, "inf_var": np.inf,
                                                                      "neg_inf_mean": -np.inf}[bad_value]
    with bn_ops.use_backend(backend):
        bad = _t(np.array([4], np.int32))
        new_m, new_v, bad = bn_ops.bn_running_update(_t(rm), _t(rv), _t(m), _t(v), 0.9, bad)
    np.testing.assert_array_equal(new_m.numpy().view(np.uint32), rm.view(np.uint32))
    np.testing.assert_array_equal(new_v.numpy().view(np.uint32), rv.view(np.uint32))
    assert bad.numpy().tolist() == [5]


@pytest.mark.skipif(not kernel_available(), reason="BN kernels not built")
def test_kernel_and_fallback_give_the_same_bits():
    rng = np.random.default_rng(2)
    rm, m = (rng.standard_normal(1000).astype(np.float32) * 3 for _ in range(2))
    rv, v = (rng.random(1000).astype(np.float32) * 5 for _ in range(2))
    outs = {}
    for backend in ("kernel", "fallback"):
        with bn_ops.use_backend(backend):
            outs[backend] = [t.numpy() for t in bn_ops.bn_running_update(
                _t(rm), _t(rv), _t(m), _t(v), 0.93, _t(np.zeros(1, np.int32)))]
    for a, b in zip(outs["kernel"], outs["fallback"]):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_layer_guard_counts_non_finite_batches_and_keeps_its_buffers(backend):
    bn = BatchNorm2d(3, momentum=0.8)
    rng = np.random.default_rng(3)
    with bn_ops.use_backend(backend):
        m, v = rng.standard_normal(3).astype(np.float32), rng.random(3).astype(np.float32)
        apply_running_update(bn, _t(m), _t(v))
        after_good = (bn.running_mean.numpy().copy(), bn.running_var.numpy().copy())
        for _ in range(2):
            apply_running_update(bn, _t(np.array([0.0, np.nan, 1.0], np.float32)), _t(v))
        np.testing.assert_array_equal(bn.running_mean.numpy(), after_good[0])
        np.testing.assert_array_equal(bn.running_var.numpy(), after_good[1])
        want_m, want_v = numpy_update(np.zeros(3, np.float32), np.ones(3, np.float32), m, v, 0.8)
        np.testing.assert_array_equal(after_good[0].reshape(-1), want_m)
        np.testing.assert_array_equal(after_good[1].reshape(-1), want_v)
        assert take_nonfinite_counts(bn) == {"BatchNorm2d": 2}
        assert take_nonfinite_counts(bn) == {}
        apply_running_update(bn, _t(np.array([np.inf, 0.0, 1.0], np.float32)), _t(v))
        assert take_nonfinite_counts(bn) == {"BatchNorm2d": 1}
        assert bn.num_batches_tracked == 4


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_cumulative_average_skips_non_finite_batches(backend):
    """momentum=None: the running values are the plain average of the finite batches (keep = 1 - 1/n for the n-th
    finite one), a NaN batch between them neither moves them nor advances n, and is counted."""
    bn = BatchNorm2d(4, momentum=None)
    rng = np.random.default_rng(5)
    m1, m2 = (rng.standard_normal(4).astype(np.float32) for _ in range(2))
    v1, v2 = (rng.random(4).astype(np.float32) for _ in range(2))
    with bn_ops.use_backend(backend):
        apply_running_update(bn, _t(m1), _t(v1))
        apply_running_update(bn, _t(np.full(4, np.nan, np.float32)), _t(v2))
        apply_running_update(bn, _t(m2), _t(v2))
        counts = take_nonfinite_counts(bn)
    want_m, want_v = numpy_update(m1, v1, m2, v2, 0.5)  # after batch 1 (keep 0) the buffers hold m1 / v1 exactly
    np.testing.assert_array_equal(bn.running_mean.numpy().reshape(-1), want_m)
    np.testing.assert_array_equal(bn.running_var.numpy().reshape(-1), want_v)
    assert bn.num_batches_tracked == 2 and counts == {"BatchNorm2d": 1}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("act,residual", [("identity", False), ("relu6", False), ("relu", True)])
@pytest.mark.parametrize("finite", [True, False], ids=["finite", "nan_in_x"])
def test_the_training_op_updates_as_the_separate_update_does(backend, act, residual, finite):
    """bn_act_train_forward_update (the batch statistics, y and the guarded running update in one op on CPU) gives
    the bits of bn_act_train_forward, the float32 unbiased variance and bn_running_update in turn; its running
    values match numpy's float64 batch statistics; a NaN in x keeps the buffers and counts the batch."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((4, 5, 3, 3)).astype(np.float32) * 2 + 1
    if not finite:
        x[2, 1, 0, 0] = np.nan
    s = rng.standard_normal(x.shape).astype(np.float32) if residual else None
    w, b = (rng.standard_normal((1, 5, 1, 1)).astype(np.float32) for _ in range(2))
    rm, rv = rng.standard_normal((1, 5, 1, 1)).astype(np.float32), rng.random((1, 5, 1, 1)).astype(np.float32) + 0.5
    st = None if s is None else _t(s)
    with bn_ops.use_backend(backend):
        got = bn_ops.bn_act_train_forward_update(_t(x), _t(w), _t(b), 1e-5, act, st, _t(rm), _t(rv),
                                                 _t(np.array([2], np.int32)), 0.9)
        y, mean, m2, invstd = bn_ops.bn_act_train_forward(_t(x), _t(w), _t(b), 1e-5, act, st)
        var = m2 * (1.0 / (x.size // 5 - 1.0))
        want = (y, mean, m2, invstd) + bn_ops.bn_running_update(_t(rm), _t(rv), mean, var, 0.9,
                                                               _t(np.array([2], np.int32)))
    assert len(got) == 7 and tuple(got[4].shape) == tuple(got[5].shape) == (1, 5, 1, 1)
    for a, e in zip(got, want):
        np.testing.assert_array_equal(a.numpy(), e.numpy())
    if finite:
        x64 = x.astype(np.float64)
        m64, v64 = x64.mean(axis=(0, 2, 3)), x64.var(axis=(0, 2, 3), ddof=1)
        np.testing.assert_allclose(got[4].numpy().reshape(-1), 0.9 * rm.reshape(-1) + 0.1 * m64, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got[5].numpy().reshape(-1), 0.9 * rv.reshape(-1) + 0.1 * v64, rtol=1e-5, atol=1e-6)
        assert got[6].numpy().tolist() == [2]
    else:
        np.testing.assert_array_equal(got[4].numpy().view(np.uint32), rm.view(np.uint32))
        np.testing.assert_array_equal(got[5].numpy().view(np.uint32), rv.view(np.uint32))
        assert got[6].numpy().tolist() == [3]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fused_act", [False, True], ids=["BatchNorm2d", "BatchNormAct2d"])
def test_a_training_layer_moves_its_buffers_as_record_batch_does(backend, fused_act, monkeypatch):
    """A local BN layer in training updates its running statistics inside its forward op; over finite and NaN
    batches its buffers, tracked-batch count and non-finite count are those of the same layer recording through
    bn_guard.record_batch (the path accumulation and momentum=None take)."""
    from basebn.layers import BatchNormAct2d
    from basebn.layers import bn_function
    layers = [BatchNormAct2d(4, act="relu", momentum=0.7) if fused_act else BatchNorm2d(4, momentum=0.7)
              for _ in range(2)]
    rng = np.random.default_rng(8)
    batches = [rng.standard_normal((3, 4, 5, 5)).astype(np.float32) for _ in range(3)]
    batches[1][0, 2, 1, 1] = np.nan
    with bn_ops.use_backend(backend):
        for i, layer in enumerate(layers):
            layer.train()
            if i == 1:
                monkeypatch.setattr(bn_function, "in_op_update_args", lambda bn: None)
            for x in batches:
                layer(_t(x))
    for name in ("running_mean", "running_var"):
        a, b = (getattr(layer, name).numpy() for layer in layers)
        assert a.shape == b.shape == (1, 4, 1, 1)
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
    assert layers[0].num_batches_tracked == layers[1].num_batches_tracked == 3
    assert take_nonfinite_counts(layers[0]) == take_nonfinite_counts(layers[1]) != {}


@pytest.mark.parametrize("backend", BACKENDS)
def test_running_statistics_of_another_size_are_refused(backend):
    """bn_act_train_forward_update with running statistics of 4 values for a 5-channel x: a ValueError naming both
    shapes, before any op runs (the C++ op would otherwise read past the batch's 5 means)."""
    x = _t(np.ones((2, 5, 3, 3), np.float32))
    wrong = r"running_mean has shape \(1, 4, 1, 1\), x has 5"
    with bn_ops.use_backend(backend), pytest.raises(ValueError, match=wrong):
        bn_ops.bn_act_train_forward_update(x, None, None, 1e-5, "relu", None, _t(np.zeros((1, 4, 1, 1), np.float32)),
                                           _t(np.ones((1, 4, 1, 1), np.float32)), _t(np.zeros(1, np.int32)), 0.9)
