"""A batch holding a NaN or inf adapts nothing, against numpy references: AdaBN's statistics are those of the
finite batches, TENT's γ/β (and Adam's state) those of the updates on the finite batches, bn_batch and TENT evaluate
the batch with the running statistics; each method logs one warning with the count."""
import megengine as mge
import numpy as np
import pytest

from basebn.engine.adapt import adabn, bn_batch_predict, evaluate_adapted, store_adapted_statistics, tent
from tests.engine.test_adapt import _NumpyAdam, _batches, _model, _np_conv, _np_entropy_grads, _np_forward, _params


def _poisoned(value=np.nan, at=1, n_batches=3):
    """Three batches of six images; one pixel of image 2 of batch `at` is `value`."""
    batches = _batches(n_batches=n_batches, n=6)
    batches[at][2, 1, 0, 2] = value
    return batches


def _population(p, batches):
    h = np.concatenate([_np_conv(p, x) for x in batches])
    return h.mean(axis=(0, 2, 3)), h.var(axis=(0, 2, 3), ddof=1)  # what precise BN stores


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_adabn_leaves_a_non_finite_batch_out_of_the_statistics(warnings, value):
    m, batches = _model(), _poisoned(value)
    p = _params(m)
    mean, var = _population(p, [batches[0], batches[2]])
    out = list(adabn(m, batches))
    np.testing.assert_allclose(m.bn.running_mean.numpy().ravel(), mean, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(m.bn.running_var.numpy().ravel(), var, rtol=1e-5, atol=1e-5)
    for x, logits in zip(batches, out):  # eval mode: the other images of the bad batch are predicted as usual
        finite = np.isfinite(x).all(axis=(1, 2, 3))
        np.testing.assert_allclose(logits[finite], _np_forward(p, x[finite], mean, var), rtol=1e-4, atol=1e-4)
    assert [w for w in warnings if "adapt adabn" in w] == [
        "adapt adabn: 1 of 3 batch(es) held NaN or inf values: left out of the BN statistics"]


def test_tent_makes_no_update_on_a_non_finite_batch_and_evaluates_it_with_running_statistics(warnings):
    lr = 0.05
    m, batches = _model(), _poisoned(np.nan)
    p = _params(m)
    gamma, beta, adam = p["g"].ravel(), p["b"].ravel(), _NumpyAdam(lr)
    out = list(tent(m, batches, lr=lr))
    for i, (x, logits) in enumerate(zip(batches, out)):
        if i == 1:  # no step: the reference's gamma/beta and Adam state (step count, moments) stay as they are
            finite = np.isfinite(x).all(axis=(1, 2, 3))
            ref = _np_forward(p, x[finite], p["mu"], p["var"], gamma=gamma, beta=beta)
            np.testing.assert_allclose(logits[finite], ref, rtol=1e-4, atol=1e-4)
            continue
        z, dg, db = _np_entropy_grads(p, x, gamma, beta)
        np.testing.assert_allclose(logits, z, rtol=1e-4, atol=1e-4)
        gamma, beta = adam.step("g", gamma, dg), adam.step("b", beta, db)
    np.testing.assert_allclose(m.bn.weight.numpy().ravel(), gamma, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(m.bn.bias.numpy().ravel(), beta, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(m.bn.running_mean.numpy(), p["mu"].astype(np.float32))
    assert [w for w in warnings if "adapt tent" in w] == [
        "adapt tent: 1 of 3 batch(es) held NaN or inf values: not adapted on (BN affine parameters and optimizer "
        "state unchanged)"]


def test_tent_skips_an_update_whose_gradient_is_non_finite(warnings):
    """Finite images, logits that overflow to inf (a classifier weight scaled by 1e38): the entropy's gradient is
    NaN. That update is skipped; the next batch's update is Adam's first step from the source γ/β."""
    lr = 0.05
    m, batches = _model(), _batches(n_batches=2, n=6)
    p = _params(m)
    fc = m.fc.weight.numpy().copy()
    m.fc.weight._reset(mge.tensor(fc * 1e38))
    steps = tent(m, batches, lr=lr)
    next(steps)
    np.testing.assert_array_equal(m.bn.weight.numpy(), p["g"].astype(np.float32))  # no update
    np.testing.assert_array_equal(m.bn.bias.numpy(), p["b"].astype(np.float32))
    m.fc.weight._reset(mge.tensor(fc))
    next(steps)
    _, dg, db = _np_entropy_grads(p, batches[1], p["g"].ravel(), p["b"].ravel())
    adam = _NumpyAdam(lr)  # a fresh state: the skipped update counted no step and left no moment
    np.testing.assert_allclose(m.bn.weight.numpy().ravel(), adam.step("g", p["g"].ravel(), dg), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(m.bn.bias.numpy().ravel(), adam.step("b", p["b"].ravel(), db), rtol=1e-5, atol=1e-6)
    steps.close()
    assert any(w.startswith("adapt tent: 1 of 2 batch(es) held NaN or inf values") for w in warnings), warnings


def test_bn_batch_evaluates_a_non_finite_batch_with_the_running_statistics(warnings):
    m, batches = _model(), _poisoned(np.inf)
    p = _params(m)
    out = list(bn_batch_predict(m, batches))
    x = batches[1]
    finite = np.isfinite(x).all(axis=(1, 2, 3))
    np.testing.assert_allclose(out[1][finite], _np_forward(p, x[finite], p["mu"], p["var"]), rtol=1e-4, atol=1e-4)
    h = _np_conv(p, batches[2])  # the next batch: its own statistics again
    np.testing.assert_allclose(out[2], _np_forward(p, batches[2], h.mean(axis=(0, 2, 3)), h.var(axis=(0, 2, 3))),
                               rtol=1e-4, atol=1e-4)
    assert m.bn.training and m.bn.track_running_stats  # flags as they were
    assert [w for w in warnings if "adapt bn_batch" in w] == [
        "adapt bn_batch: 1 of 3 batch(es) held NaN or inf values: evaluated with the running statistics instead of "
        "their own"]


def test_the_statistics_saved_after_tent_leave_a_non_finite_batch_out():
    """basebn.test's path: evaluate_adapted on a labelled loader, then the statistics --save-adapted writes."""
    m, batches = _model(), _poisoned(np.nan)
    labels = [np.zeros(len(x), np.int32) for x in batches]
    result = evaluate_adapted(m, list(zip(batches, labels)), "tent", lr=0.05)
    assert result["images"] == 18
    assert all(np.isfinite(v.numpy()).all() for v in (m.bn.weight, m.bn.bias))
    store_adapted_statistics(m, list(zip(batches, labels)), "tent")
    mean, var = _population(_params(m), [batches[0], batches[2]])
    np.testing.assert_allclose(m.bn.running_mean.numpy().ravel(), mean, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(m.bn.running_var.numpy().ravel(), var, rtol=1e-5, atol=1e-5)
