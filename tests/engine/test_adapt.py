"""basebn.engine.adapt against numpy transcriptions: test-batch BN, AdaBN population statistics, TENT steps."""
import megengine as mge
import megengine.functional as F
import megengine.module as M
import numpy as np
import pytest

from basebn.engine.adapt import (adabn, bn_batch_predict, evaluate_adapted, predict, prepare_for_adaptation,
                                 store_adapted_statistics, tent)
from basebn.layers import BatchNorm2d, FrozenBatchNorm2d, SyncBatchNorm, convert_frozen_batchnorm

EPS = 1e-5
C_IN, C, K = 3, 4, 5


class TwoLayer(M.Module):
    """1x1 conv -> BN -> global average pool -> linear."""

    def __init__(self, norm=BatchNorm2d):
        super().__init__()
        self.conv = M.Conv2d(C_IN, C, 1, bias=False)
        self.bn = norm(C, eps=EPS)
        self.fc = M.Linear(C, K)

    def forward(self, x):
        return self.fc(F.mean(self.bn(self.conv(x)), axis=(2, 3)))


def _model(seed=0, norm=BatchNorm2d):
    rng = np.random.default_rng(seed)
    m = TwoLayer(norm)
    m.conv.weight._reset(mge.tensor(rng.normal(size=(C, C_IN, 1, 1)).astype(np.float32)))
    m.fc.weight._reset(mge.tensor(rng.normal(size=(K, C)).astype(np.float32)))
    m.fc.bias._reset(mge.tensor(rng.normal(size=(K,)).astype(np.float32)))
    m.bn.weight._reset(mge.tensor(rng.uniform(0.5, 1.5, (1, C, 1, 1)).astype(np.float32)))
    m.bn.bias._reset(mge.tensor(rng.normal(size=(1, C, 1, 1)).astype(np.float32)))
    m.bn.running_mean._reset(mge.tensor(rng.normal(size=(1, C, 1, 1)).astype(np.float32)))
    m.bn.running_var._reset(mge.tensor(rng.uniform(0.5, 2, (1, C, 1, 1)).astype(np.float32)))
    return m


def _batches(n_batches=3, n=6, seed=1, shift=2.0):
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(n, C_IN, 3, 3)) * 1.5 + shift).astype(np.float32) for _ in range(n_batches)]


def _params(m):
    return {k: v.numpy().astype(np.float64) for k, v in
            dict(w=m.conv.weight, g=m.bn.weight, b=m.bn.bias, mu=m.bn.running_mean, var=m.bn.running_var,
                 fw=m.fc.weight, fb=m.fc.bias).items()}


def _np_conv(p, x):
    return np.einsum("oc,nchw->nohw", p["w"][:, :, 0, 0], x.astype(np.float64))


def _np_head(p, y):
    return y.mean(axis=(2, 3)) @ p["fw"].T + p["fb"]


def _np_forward(p, x, mean, var, gamma=None, beta=None):
    h = _np_conv(p, x)
    gamma = p["g"] if gamma is None else gamma
    beta = p["b"] if beta is None else beta
    y = (h - mean.reshape(1, C, 1, 1)) / np.sqrt(var.reshape(1, C, 1, 1) + EPS) * gamma.reshape(1, C, 1, 1) \
        + beta.reshape(1, C, 1, 1)
    return _np_head(p, y)


def _batch_moments(h):
    return h.mean(axis=(0, 2, 3)), h.var(axis=(0, 2, 3))  # biased: what BN normalises with


def test_bn_batch_equals_numpy_batch_statistics_and_leaves_model_unchanged():
    m, batches = _model(), _batches()
    p = _params(m)
    before = {k: v.copy() for k, v in p.items()}
    out = list(bn_batch_predict(m, batches))
    for x, logits in zip(batches, out):
        mean, var = _batch_moments(_np_conv(p, x))
        np.testing.assert_allclose(logits, _np_forward(p, x, mean, var), rtol=1e-4, atol=1e-4)
    after = _params(m)
    for k in before:
        np.testing.assert_array_equal(after[k], before[k])
    assert m.training and m.bn.training and m.bn.track_running_stats  # flags as they were (train mode)


def test_bn_batch_differs_from_running_statistics_prediction():
    m, batches = _model(), _batches()
    p = _params(m)
    plain = list(predict(m, batches))
    np.testing.assert_allclose(plain[0], _np_forward(p, batches[0], p["mu"], p["var"]), rtol=1e-4, atol=1e-4)
    assert not np.allclose(plain[0], next(bn_batch_predict(m, batches)), atol=1e-2)


def test_adabn_equals_numpy_population_statistics():
    m, batches = _model(), _batches(n_batches=3, n=5)
    p = _params(m)
    h = np.concatenate([_np_conv(p, x) for x in batches])
    mean = h.mean(axis=(0, 2, 3))
    unbiased = h.var(axis=(0, 2, 3), ddof=1)  # what precise BN stores
    out = list(adabn(m, batches))
    np.testing.assert_allclose(m.bn.running_mean.numpy().ravel(), mean, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(m.bn.running_var.numpy().ravel(), unbiased, rtol=1e-5, atol=1e-5)
    for x, logits in zip(batches, out):
        np.testing.assert_allclose(logits, _np_forward(p, x, mean, unbiased), rtol=1e-4, atol=1e-4)


def test_adabn_refuses_a_one_shot_iterator():
    with pytest.raises(TypeError, match="twice"):
        list(adabn(_model(), iter(_batches())))


def _np_entropy_grads(p, x, gamma, beta):
    """(logits, d mean-entropy / d gamma, d / d beta) by the chain rule, batch statistics."""
    h = _np_conv(p, x)
    mean, var = _batch_moments(h)
    xhat = (h - mean.reshape(1, C, 1, 1)) / np.sqrt(var.reshape(1, C, 1, 1) + EPS)
    y = xhat * gamma.reshape(1, C, 1, 1) + beta.reshape(1, C, 1, 1)
    z = _np_head(p, y)
    zs = z - z.max(axis=1, keepdims=True)
    logp = zs - np.log(np.exp(zs).sum(axis=1, keepdims=True))
    prob = np.exp(logp)
    ent = -(prob * logp).sum(axis=1)
    dz = -prob * (logp + ent[:, None]) / len(x)  # d mean(H) / dz
    dpool = dz @ p["fw"]
    dy = np.broadcast_to(dpool[:, :, None, None] / (h.shape[2] * h.shape[3]), h.shape)
    return z, (dy * xhat).sum(axis=(0, 2, 3)), dy.sum(axis=(0, 2, 3))


class _NumpyAdam:
    def __init__(self, lr, b1=0.9, b2=0.999, eps=1e-8):
        self.lr, self.b1, self.b2, self.eps, self.t, self.m, self.v = lr, b1, b2, eps, 0, {}, {}

    def step(self, key, value, grad):
        self.t += key == "g"
        m = self.m[key] = self.b1 * self.m.get(key, 0.0) + (1 - self.b1) * grad
        v = self.v[key] = self.b2 * self.v.get(key, 0.0) + (1 - self.b2) * grad * grad
        mhat, vhat = m / (1 - self.b1 ** self.t), v / (1 - self.b2 ** self.t)
        return value - self.lr * mhat / (np.sqrt(vhat) + self.eps)


@pytest.mark.parametrize("episodic", [False, True])
def test_tent_steps_equal_numpy_entropy_gradient_and_adam(episodic):
    lr = 0.05
    m, batches = _model(), _batches(n_batches=3, n=6)
    p = _params(m)
    gamma, beta = p["g"].ravel(), p["b"].ravel()
    adam = _NumpyAdam(lr)
    out = list(tent(m, batches, lr=lr, episodic=episodic))
    for x, logits in zip(batches, out):
        if episodic:
            gamma, beta, adam = p["g"].ravel(), p["b"].ravel(), _NumpyAdam(lr)
        z, dg, db = _np_entropy_grads(p, x, gamma, beta)
        np.testing.assert_allclose(logits, z, rtol=1e-4, atol=1e-4)  # the forward used for the update
        gamma, beta = adam.step("g", gamma, dg), adam.step("b", beta, db)
    np.testing.assert_allclose(m.bn.weight.numpy().ravel(), gamma, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(m.bn.bias.numpy().ravel(), beta, rtol=1e-5, atol=1e-6)
    assert np.abs(gamma - p["g"].ravel()).max() > 1e-3  # it did move
    np.testing.assert_array_equal(m.bn.running_mean.numpy(), p["mu"].astype(np.float32))  # untouched
    np.testing.assert_array_equal(m.conv.weight.numpy(), p["w"].astype(np.float32))  # only BN affine trained
    np.testing.assert_array_equal(m.fc.weight.numpy(), p["fw"].astype(np.float32))


def test_tent_two_steps_reports_the_second_forward():
    lr = 0.05
    m, batches = _model(), _batches(n_batches=1)
    p = _params(m)
    adam = _NumpyAdam(lr)
    gamma, beta = p["g"].ravel(), p["b"].ravel()
    _, dg, db = _np_entropy_grads(p, batches[0], gamma, beta)
    gamma, beta = adam.step("g", gamma, dg), adam.step("b", beta, db)
    z2, _, _ = _np_entropy_grads(p, batches[0], gamma, beta)
    (logits,) = list(tent(m, batches, lr=lr, steps=2))
    np.testing.assert_allclose(logits, z2, rtol=1e-4, atol=1e-4)


def test_tent_sgd_step_equals_numpy():
    lr = 0.1
    m, batches = _model(), _batches(n_batches=1)
    p = _params(m)
    _, dg, db = _np_entropy_grads(p, batches[0], p["g"].ravel(), p["b"].ravel())
    list(tent(m, batches, lr=lr, optimizer="sgd", momentum=0.9, nesterov=True))
    # first nesterov step: buf = g, update = g + 0.9 * buf
    np.testing.assert_allclose(m.bn.weight.numpy().ravel(), p["g"].ravel() - lr * 1.9 * dg, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(m.bn.bias.numpy().ravel(), p["b"].ravel() - lr * 1.9 * db, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["sync", "frozen"])
def test_prepare_converts_sync_and_frozen_bn_keeping_values(kind):
    ref = _model()
    m = _model(norm=SyncBatchNorm) if kind == "sync" else convert_frozen_batchnorm(_model())
    if kind == "sync":
        m.load_state_dict(ref.state_dict())
    else:
        assert isinstance(m.bn, FrozenBatchNorm2d)
    m = prepare_for_adaptation(m)
    assert type(m.bn) is BatchNorm2d
    batches = _batches()
    np.testing.assert_allclose(next(bn_batch_predict(m, batches)), next(bn_batch_predict(ref, batches)),
                               rtol=1e-5, atol=1e-5)


def test_evaluate_adapted_scores_in_order_and_save_statistics():
    m, batches = _model(), _batches(n_batches=2, n=4)
    logits = list(bn_batch_predict(m, batches))
    labels = [np.argmax(z, axis=1).astype(np.int32) for z in logits]
    labels[1][0] = (labels[1][0] + 1) % K  # one wrong: 7 of 8
    result = evaluate_adapted(m, list(zip(batches, labels)), "bn_batch")
    assert result["images"] == 8 and result["top1"] == pytest.approx(100 * 7 / 8)
    store_adapted_statistics(m, batches, "bn_batch")
    h = np.concatenate([_np_conv(_params(m), x) for x in batches])
    np.testing.assert_allclose(m.bn.running_mean.numpy().ravel(), h.mean(axis=(0, 2, 3)), rtol=1e-5, atol=1e-5)


FAMILY_MODELS = ["resnet20", "resnet18", "wrn_16_8", "resnet18d", "regnetx_002", "regnety_002", "mbnetv1_x025",
                 "mbnetv2_x035", "mbnetv3_small_x075", "effnet_b0", "effnet_b0_lite", "effnetv2_b0", "snetv2_x050",
                 "snetv2p_x075", "repvgg_a0"]


def _family_case(name, norm, size=32):
    from basebn.models import build_model
    model = prepare_for_adaptation(build_model(name, num_classes=10, norm=norm))
    images = [np.random.default_rng(0).normal(size=(4, 3, size, size)).astype(np.float32)]
    before = {k: np.array(v) for k, v in model.state_dict().items()}
    list(bn_batch_predict(model, images))
    for k, v in model.state_dict().items():  # bn_batch changes nothing
        np.testing.assert_array_equal(np.asarray(v), before[k], err_msg=k)
    (logits,) = list(tent(model, images, lr=0.01))
    assert logits.shape == (4, 10) and np.isfinite(logits).all()
    bn_affine = {f"{n}.{leaf}" for n, m in model.named_modules() if isinstance(m, BatchNorm2d)  # fused BN-act too
                 for leaf in ("weight", "bias")}
    moved = {k for k, v in model.state_dict().items() if not np.array_equal(np.asarray(v), before[k])}
    assert moved and moved <= bn_affine  # only BN affine parameters are trained, running statistics kept


@pytest.mark.parametrize("norm", ["BN", "FrozenBN"])
@pytest.mark.parametrize("name", FAMILY_MODELS)
def test_every_family_adapts_only_bn_affine(name, norm):
    _family_case(name, norm)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["vgg11_bn", "hrnet_w18_small_v1"])
def test_large_input_families_adapt_only_bn_affine(name):
    _family_case(name, "BN", size=64)
