"""BatchNormAct2d / SyncBatchNormAct2d / FrozenBatchNormAct2d (basebn.layers.bn_act) against a float64 numpy
transcription of BN -> [add] -> activation: outputs, gradients (x, shortcut, weight, bias), running statistics;
state dicts, jit.trace, conversions and conv-BN pairing; and the multi-process fused SyncBN against one
process on the whole batch.
"""
import io

import numpy as np
import pytest

import megengine as mge
import megengine.functional as F
from megengine import jit
from megengine.autodiff import GradManager

import basebn.distributed as dist
from basebn.layers import (
    BatchNorm2d,
    BatchNormAct2d,
    FrozenBatchNorm2d,
    FrozenBatchNormAct2d,
    SyncBatchNorm,
    SyncBatchNormAct2d,
    convert_frozen_batchnorm,
    convert_sync_batchnorm,
    convert_to_batchnorm,
    norm_act,
    revert_sync_batchnorm,
    with_act,
)
from basebn.ops import bn_ops
from basebn.layers.bn_act import NormActTail
from tests.support.bn_act_ref import act_grad_ref, act_ref, min_kink_distance
from tests.support.mpi_launch import run_mpi

EPS = 1e-5


@pytest.fixture(autouse=True)
def _one_process():
    """SyncBN layers run alone (no launcher): basebn.distributed in its single-process mode."""
    dist.shutdown()
    dist.init("none")
    yield
    dist.shutdown()


# ------------------------------------------------------------------------------ reference
def _c(v):
    return np.asarray(v, np.float64).reshape(1, -1, 1, 1)


def bn_act_ref(x, s, dy, w, b, act, mean=None, var=None):
    """Training (mean None) or eval BN -> add -> act in float64: y, dx, ds, dw, db, batch mean, unbiased var,
    pre-activation."""
    x, dy = x.astype(np.float64), dy.astype(np.float64)
    n = x.size // x.shape[1]
    train = mean is None
    if train:
        mean, var = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))
    invstd = 1.0 / np.sqrt(var + EPS)
    xhat = (x - _c(mean)) * _c(invstd)
    pre = xhat * _c(w) + _c(b) + (0 if s is None else s.astype(np.float64))
    dz = dy * act_grad_ref(pre, act)
    dw, db = (dz * xhat).sum(axis=(0, 2, 3)), dz.sum(axis=(0, 2, 3))
    if train:
        dx = _c(np.asarray(w) * invstd) * (dz - _c(db / n) - xhat * _c(dw / n))
    else:
        dx = _c(np.asarray(w) * invstd) * dz
    return act_ref(pre, act), dx, dz, dw, db, mean, var * n / (n - 1), pre


def close(a, b, tol=2e-5):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    np.testing.assert_allclose(a, b, rtol=0, atol=tol * max(1.0, float(np.abs(b).max(initial=0))))


def _data(shape, seed):
    rng = np.random.default_rng(seed)
    c = shape[1]
    x = (rng.standard_normal(shape) * 3 + 2).astype(np.float32)
    s = rng.standard_normal(shape).astype(np.float32)
    g = rng.standard_normal(shape).astype(np.float32)
    w = rng.uniform(2, 4, c) * rng.choice([-1, 1], c)
    b = rng.uniform(0, 3, c)
    return x, s, g, w, b


def _set(param, value):
    param[...] = mge.tensor(np.asarray(value, np.float32).reshape(param.shape))


def _layer(cls, w, b, act="relu", training=True, **kwargs):
    """A ``cls`` layer of len(w) channels with weight ``w`` and bias ``b``, in training or eval mode."""
    layer = cls(len(w), act=act, **kwargs)
    _set(layer.weight, w)
    _set(layer.bias, b)
    layer.train(training)
    return layer


def _step(layer, x, s, g):
    """Forward (with the shortcut when s is not None) and backward of sum(y * g); numpy results."""
    xt, st = mge.tensor(x), None if s is None else mge.tensor(s)
    params = [p for p in (layer.weight, layer.bias) if isinstance(p, mge.Parameter)]
    gm = GradManager().attach(params + [xt] + ([st] if st is not None else []))
    with gm:
        y = layer(xt) if st is None else layer(xt, st)
        gm.backward((y * mge.tensor(g)).sum())
    grads = [xt.grad.numpy(), None if st is None else st.grad.numpy()]
    grads += [None if not params or p.grad is None else p.grad.numpy().reshape(-1) for p in params]
    for p in params:
        p.grad = None
    return (y.numpy(), *grads)


def _away_from_kinks(pre):
    assert min_kink_distance(pre) > 1e-4, "test data too close to a kink"


# ------------------------------------------------------------------------ single process
@pytest.mark.parametrize("act,residual", [(None, False), ("relu", False), ("relu", True), ("silu", False)],
                         ids=["bn", "relu", "add_relu", "silu"])
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_parameter_gradients_keep_the_parameters_shape(backend, act, residual, training):
    """The local training Functions take the (1, C, 1, 1) parameters as they are (no reshape ops): the gradients
    they hand back must still have the parameters' shape (a (C,) gradient broadcasts wrongly in the SGD step:
    (1, C, 1, 1) with (C,) is (1, C, 1, C)), and their values the float64 reference's; the SGD step then leaves
    every parameter its shape and moves it by -lr * grad."""
    from basebn.engine.optimizer import InplaceSGD
    shape = (4, 5, 3, 3)
    x, s, g, w, b = _data(shape, seed=11)
    s = s if residual else None
    layer = _layer(BatchNormAct2d, w, b, act or "identity", training=training)
    if act is None:  # plain BatchNorm2d: the same tensors, the class without an activation
        layer.__class__ = BatchNorm2d
    stats = (None, None) if training else (layer.running_mean.numpy().reshape(-1),
                                           layer.running_var.numpy().reshape(-1))
    ref = bn_act_ref(x, s, g, w, b, act or "identity", *stats)
    xt, st = mge.tensor(x), None if s is None else mge.tensor(s)
    gm = GradManager().attach([layer.weight, layer.bias, xt])
    with gm:
        y = layer(xt) if st is None else layer(xt, st)
        gm.backward((y * mge.tensor(g)).sum())
    for p, want in ((layer.weight, ref[3]), (layer.bias, ref[4])):
        assert tuple(p.grad.shape) == (1, shape[1], 1, 1)
        close(p.grad.numpy().reshape(-1), want)
    old = [p.numpy() for p in (layer.weight, layer.bias)]
    grads = [p.grad.numpy() for p in (layer.weight, layer.bias)]
    InplaceSGD([layer.weight, layer.bias], lr=0.5, momentum=0.9).step()
    for p, p0, g0 in zip((layer.weight, layer.bias), old, grads):
        assert tuple(p.shape) == (1, shape[1], 1, 1)
        close(p.numpy(), p0 - 0.5 * g0)


@pytest.mark.parametrize("cls", [BatchNormAct2d, SyncBatchNormAct2d])
@pytest.mark.parametrize("act", ["relu", "relu6", "identity", "silu", "hswish"])
@pytest.mark.parametrize("residual", [False, True], ids=["act", "add_act"])
def test_train_matches_numpy(backend, cls, act, residual):
    """Two training steps; SiLU / HSwish with a shortcut run as fused-free BN, add, activation (no residual form)."""
    rm, rv = np.zeros(3), np.ones(3)
    layer = None
    for step in range(2):
        x, s, g, w, b = _data((4, 3, 5, 6), seed=step + 10 * residual)
        if layer is None:
            layer = _layer(cls, w, b, act)
        else:  # the second step with new affine values, the running statistics carried over
            _set(layer.weight, w)
            _set(layer.bias, b)
        s = s if residual else None
        y, dx, ds, dw, db = _step(layer, x, s, g)
        ry, rdx, rds, rdw, rdb, mean, var, pre = bn_act_ref(x, s, g, w, b, act)
        _away_from_kinks(pre)
        close(y, ry)
        close(dx, rdx)
        if residual:
            close(ds, rds)
        close(dw, rdw)
        close(db, rdb)
        rm, rv = 0.9 * rm + 0.1 * mean, 0.9 * rv + 0.1 * var
        close(layer.running_mean.numpy().reshape(-1), rm)
        close(layer.running_var.numpy().reshape(-1), rv)


@pytest.mark.parametrize("act", ["relu", "silu", "hswish"])
@pytest.mark.parametrize("residual", [False, True], ids=["act", "add_act"])
def test_eval_and_freeze_use_running_stats(backend, act, residual):
    x, s, g, w, b = _data((3, 4, 4, 5), seed=3)
    s = s if residual else None
    mean, var = np.array([1.5, 2.0, 2.5, 1.0]), np.array([8.0, 9.0, 10.0, 7.0])
    for freeze in (False, True):
        layer = _layer(BatchNormAct2d, w, b, act, freeze=freeze, training=freeze)  # freeze: running stats in training
        _set(layer.running_mean, mean)
        _set(layer.running_var, var)
        y, dx, ds, dw, db = _step(layer, x, s, g)
        ry, rdx, rds, rdw, rdb, _, _, pre = bn_act_ref(x, s, g, w, b, act, mean, var)
        _away_from_kinks(pre)
        close(y, ry)
        close(dx, rdx)
        if residual:
            close(ds, rds)
        if freeze:  # MegEngine's freeze: the affine is used, not learned
            assert dw is None and db is None
        else:
            close(dw, rdw)
            close(db, rdb)
        close(layer.running_mean.numpy().reshape(-1), mean)  # unchanged
        close(layer.running_var.numpy().reshape(-1), var)


@pytest.mark.parametrize("act", list(bn_ops.PRE_GRAD_ACTIVATIONS))
@pytest.mark.parametrize("shape,layout", [((1, 3, 5, 6), "contiguous"), ((4, 1, 5, 6), "contiguous"),
                                          ((3, 4, 5, 6), "transposed")], ids=["N1", "C1", "non_contiguous"])
def test_pre_grad_activations_edge_shapes(backend, act, shape, layout):
    """SiLU / HSwish (backward recomputing the pre-activation from x) with N = 1, C = 1 and a non-contiguous x
    (a transposed view); gradients of x, weight and bias and the running statistics against numpy."""
    x, _, g, w, b = _data(shape, seed=sum(shape))
    layer = _layer(BatchNormAct2d, w, b, act)
    xt = mge.tensor(x)
    if layout == "transposed":
        xt = mge.tensor(np.ascontiguousarray(x.transpose(1, 0, 2, 3))).transpose(1, 0, 2, 3)
    gm = GradManager().attach([layer.weight, layer.bias, xt])
    with gm:
        y = layer(xt)
        gm.backward((y * mge.tensor(g)).sum())
    ry, rdx, _, rdw, rdb, mean, var, pre = bn_act_ref(x, None, g, w, b, act)
    _away_from_kinks(pre)
    close(y.numpy(), ry)
    close(xt.grad.numpy(), rdx)
    close(layer.weight.grad.numpy().reshape(-1), rdw)
    close(layer.bias.grad.numpy().reshape(-1), rdb)
    close(layer.running_mean.numpy().reshape(-1), 0.1 * mean)
    close(layer.running_var.numpy().reshape(-1), 0.9 + 0.1 * var)


def test_same_state_dict_and_buffers_as_batchnorm2d():
    plain, fused = BatchNorm2d(5), BatchNormAct2d(5, act="relu6")
    assert list(plain.state_dict()) == list(fused.state_dict())
    rng = np.random.default_rng(0)
    sd = {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in plain.state_dict().items()}
    fused.load_state_dict(sd)
    plain.load_state_dict(fused.state_dict())
    for k, v in plain.state_dict().items():
        np.testing.assert_array_equal(v, sd[k])
    assert isinstance(fused, BatchNorm2d) and "act=relu6" in repr(fused)
    with pytest.raises(ValueError, match="activation"):
        BatchNormAct2d(5, act="gelu")


def test_ghost_bn_runs_unfused(backend):
    """norm_batch_size (ghost BN) is not fused: BN in groups of 2 samples, then the activation."""
    x, s, g, w, b = _data((4, 3, 4, 4), seed=4)
    layer = _layer(BatchNormAct2d, w, b, norm_batch_size=2)
    y = layer(mge.tensor(x), mge.tensor(s)).numpy()
    want = np.concatenate([bn_act_ref(x[i:i + 2], s[i:i + 2], g[i:i + 2], w, b, "relu")[0] for i in (0, 2)])
    close(y, want)


def test_with_act_and_norm_act():
    fused = with_act(BatchNorm2d(3), "relu")
    assert type(fused) is BatchNormAct2d and fused.act == "relu"
    assert type(with_act(SyncBatchNorm(3), "relu6")) is SyncBatchNormAct2d
    assert type(with_act(FrozenBatchNorm2d(3), "relu")) is FrozenBatchNormAct2d
    gn = mge.module.GroupNorm(1, 3)
    assert with_act(gn, "relu") is gn  # no fused form: the caller's norm_act applies the activation
    x = mge.tensor(np.random.default_rng(1).standard_normal((2, 3, 4, 4)).astype(np.float32))
    s = mge.tensor(np.ones((2, 3, 4, 4), np.float32))
    np.testing.assert_allclose(norm_act(gn, x, "relu", shortcut=s).numpy(), F.relu(gn(x) + s).numpy())
    with pytest.raises(ValueError, match="relu"):
        norm_act(fused, x, "relu6")


@pytest.mark.parametrize("symbolic", [False, True])
def test_jit_trace_is_megengine_bn_then_activation(symbolic):
    """Under jit.trace: MegEngine's own BN op then the plain activation; the dump holds no custom op."""
    x, s, _, w, b = _data((2, 3, 4, 4), seed=5)
    layer = _layer(BatchNormAct2d, w, b, training=False)

    @jit.trace(symbolic=symbolic, capture_as_const=True)
    def fn(inp, sc):
        return layer(inp, sc)

    for _ in range(2):
        y = fn(mge.tensor(x), mge.tensor(s))
    close(y.numpy(), bn_act_ref(x, s, s, w, b, "relu", np.zeros(3), np.ones(3))[0])
    buf = io.BytesIO()
    fn.dump(buf, arg_names=["x", "s"])
    assert b"Basebn" not in buf.getvalue()


def test_sync_and_frozen_conversions_keep_the_activation(backend):
    x, s, g, w, b = _data((2, 3, 4, 4), seed=6)
    layer = _layer(BatchNormAct2d, w, b, act="relu6", training=False)
    want = layer(mge.tensor(x), mge.tensor(s)).numpy()
    synced = convert_sync_batchnorm(layer)
    assert type(synced) is SyncBatchNormAct2d and synced.act == "relu6"
    close(synced(mge.tensor(x), mge.tensor(s)).numpy(), want)
    back = revert_sync_batchnorm(synced)
    assert type(back) is BatchNormAct2d and back.act == "relu6"
    frozen = convert_frozen_batchnorm(back)
    assert type(frozen) is FrozenBatchNormAct2d and frozen.act == "relu6"
    close(frozen(mge.tensor(x), mge.tensor(s)).numpy(), want)
    again = convert_to_batchnorm(frozen)
    assert type(again) is BatchNormAct2d and again.act == "relu6"
    tail = frozen.to_batchnorm()  # MegEngine's BatchNorm2d: no fused form, the activation wraps it
    assert isinstance(tail, NormActTail)
    close(tail(mge.tensor(x), mge.tensor(s)).numpy(), want)


# ---------------------------------------------------------------------------- under MPI
def _mpi_case(tmp_path, sizes, seed):
    rng = np.random.default_rng(seed)
    total = sum(sizes)
    data = {"sizes": np.array(sizes), "w": rng.uniform(2, 4, 3) * np.array([1, -1, 1]), "b": rng.uniform(0, 3, 3)}
    for step in range(2):
        data[f"x{step}"] = (rng.standard_normal((total, 3, 3, 2)) * 3 + 2).astype(np.float32)
        data[f"s{step}"] = rng.standard_normal((total, 3, 3, 2)).astype(np.float32)
        data[f"g{step}"] = rng.standard_normal((total, 3, 3, 2)).astype(np.float32)
    np.savez(tmp_path / "in.npz", **data)
    return data


@pytest.mark.mpi
@pytest.mark.parametrize("sizes", [[1, 4], [3, 0, 2]], ids=lambda s: "-".join(map(str, s)))
def test_mpi_fused_sync_bn_matches_single_process(tmp_path, sizes):
    """SyncBatchNormAct2d (BN + add + ReLU) over uneven shards (an empty rank too) equals BN on the whole batch;
    still one all_gather forward and one all_reduce backward per layer."""
    data = _mpi_case(tmp_path, sizes, seed=len(sizes) * 7 + sizes[0])
    world = len(sizes)
    run_mpi(world, "-m", "tests.workers.mpi_bn_act_worker", tmp_path)
    outs = [dict(np.load(tmp_path / f"out_{r}.npz")) for r in range(world)]
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    rm, rv = np.zeros(3), np.ones(3)
    for step in range(2):
        y, dx, ds, dw, db, mean, var, pre = bn_act_ref(data[f"x{step}"], data[f"s{step}"], data[f"g{step}"],
                                                       data["w"], data["b"], "relu")
        _away_from_kinks(pre)
        rm, rv = 0.9 * rm + 0.1 * mean, 0.9 * rv + 0.1 * var
        for r, out in enumerate(outs):
            lo, hi = bounds[r], bounds[r + 1]
            close(out[f"y{step}"], y[lo:hi])
            close(out[f"dx{step}"], dx[lo:hi])
            close(out[f"ds{step}"], ds[lo:hi])
            close(out[f"rm{step}"], rm)
            close(out[f"rv{step}"], rv)
            np.testing.assert_array_equal(out[f"counts{step}"], [1, 1])
        close(sum(o[f"dw{step}"] for o in outs), dw)  # per-rank shares add up to the whole batch's
        close(sum(o[f"db{step}"] for o in outs), db)


def test_fused_activation_slot_runs_no_op():
    """The activation slot a fused layer leaves empty returns its input itself (MegEngine's Identity runs a Copy op
    forward and backward), is still an ``M.Identity``, and gradients pass through it unchanged."""
    import megengine.module as M
    from basebn.layers import PassThrough
    from basebn.layers.activation import build_activation
    from basebn.layers.bn_act import norm_then_act
    norm, act = norm_then_act(BatchNorm2d(3), "relu")
    assert norm.act == "relu" and isinstance(act, PassThrough) and isinstance(act, M.Identity)
    assert isinstance(build_activation(None), PassThrough)
    x = mge.tensor(np.arange(6, dtype=np.float32))
    assert act(x) is x
    gm = GradManager().attach([x])
    with gm:
        gm.backward((act(x) * 3.0).sum())
    np.testing.assert_array_equal(x.grad.numpy(), np.full(6, 3.0, np.float32))
    _, unfused = norm_then_act(BatchNorm2d(3), "gelu")
    assert not isinstance(unfused, M.Identity)


def test_swish_alias_fuses_as_silu():
    """build_activation's "swish" is SiLU: with_act fuses it as "silu", and norm_act accepts either name."""
    norm = with_act(BatchNorm2d(3), "swish")
    assert norm.act == "silu"
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 4)).astype(np.float32)
    norm.eval()
    y = norm_act(norm, mge.tensor(x), "swish").numpy()
    z = (x - 0.0) / np.sqrt(1.0 + 1e-5)  # fresh running statistics: mean 0, var 1
    np.testing.assert_allclose(y, z / (1.0 + np.exp(-z)), rtol=1e-5, atol=1e-6)
