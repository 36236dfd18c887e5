"""SyncBatchNorm against a float64 numpy reference, against megengine BatchNorm, and under
``mpiexec -n 2`` / ``-n 3`` with uneven and empty per-rank batches.

Single-process tests run for every bn_ops backend that is available ("fallback" always, "kernel"
when the custom ops build here).
"""

import numpy as np
import pytest

import megengine as mge
import megengine.functional as F
import megengine.module as M
from megengine.autodiff import GradManager

import basebn.distributed as dist
from basebn.ops import bn_ops, kernel_library
from basebn.layers.batch_norm import BatchNorm2d
from basebn.layers.convert import convert_sync_batchnorm, revert_sync_batchnorm
from basebn.layers.sync_bn import SyncBatchNorm
from tests.support.mpi_launch import run_mpi

EPS = 1e-5


# ------------------------------------------------------------------------------ reference
def _cshape(x, v):
    return np.asarray(v, dtype=np.float64).reshape((1, -1) + (1,) * (x.ndim - 2))


def bn_ref(x, dy, w, b, eps=EPS):
    """Training-mode BN forward/backward in float64. Returns y, dx, dw, db, mean, unbiased var."""
    x, dy = x.astype(np.float64), dy.astype(np.float64)
    axes = (0,) + tuple(range(2, x.ndim))
    n = x.size // x.shape[1]
    mean = x.mean(axis=axes)
    var = x.var(axis=axes)
    invstd = 1.0 / np.sqrt(var + eps)
    xhat = (x - _cshape(x, mean)) * _cshape(x, invstd)
    y = xhat * _cshape(x, w) + _cshape(x, b)
    dw = (dy * xhat).sum(axis=axes)
    db = dy.sum(axis=axes)
    dx = _cshape(x, np.asarray(w) * invstd) * (dy - _cshape(x, db / n) - xhat * _cshape(x, dw / n))
    return y, dx, dw, db, mean, var * n / (n - 1)


def close(a, b, tol=2e-5):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    scale = max(1.0, float(np.abs(b).max())) if b.size else 1.0
    np.testing.assert_allclose(a, b, rtol=0, atol=tol * scale)


def _backends():
    out = [pytest.param("fallback")]
    out.append(pytest.param("kernel", marks=pytest.mark.skipif(
        "not kernel_library.kernel_available()",
        reason="bn_ops kernels unavailable here")))
    return out


@pytest.fixture(params=_backends())
def bn_backend(request):
    with bn_ops.use_backend(request.param):
        yield request.param


@pytest.fixture(autouse=True)
def _single_process():
    dist.shutdown()
    dist.init("none")
    yield
    dist.shutdown()


def _set(param, value):
    param[...] = mge.tensor(np.asarray(value, np.float32).reshape(param.shape))


def _step(bn, x, g):
    """One forward+backward; returns y, dx, dw, db (None when not affine) and collective counts."""
    xt = mge.tensor(x)
    params = list(bn.parameters())
    gm = GradManager().attach(params + [xt])
    with dist.count_collectives() as c:
        with gm:
            y = bn(xt)
            fwd = c.as_dict()
            gm.backward((y * mge.tensor(g)).sum())
    bwd = {k: v - fwd[k] for k, v in c.as_dict().items()}
    dw = bn.weight.grad.numpy().reshape(-1) if bn.affine and bn.weight.grad is not None else None
    db = bn.bias.grad.numpy().reshape(-1) if bn.affine and bn.bias.grad is not None else None
    for p in params:
        p.grad = None
    return y.numpy(), xt.grad.numpy(), dw, db, fwd, bwd


SHAPES = [(6, 3), (4, 3, 5), (3, 2, 4, 5), (2, 3, 2, 3, 4), (1, 3, 4, 4), (5, 1, 3, 3)]


# ------------------------------------------------------------------------ single process
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("affine", [True, False])
def test_train_matches_numpy(bn_backend, shape, affine):
    rng = np.random.RandomState(hash(shape) % 2**31)
    c = shape[1]
    bn = SyncBatchNorm(c, affine=affine)
    w, b = (rng.uniform(0.5, 2, c), rng.randn(c)) if affine else (np.ones(c), np.zeros(c))
    if affine:
        _set(bn.weight, w)
        _set(bn.bias, b)
    rm, rv = np.zeros(c), np.ones(c)
    for step in range(2):
        x = (rng.randn(*shape) * 3 + 2).astype(np.float32)
        g = rng.randn(*shape).astype(np.float32)
        y, dx, dw, db, fwd, bwd = _step(bn, x, g)
        ry, rdx, rdw, rdb, mean, var = bn_ref(x, g, w, b)
        close(y, ry)
        close(dx, rdx)
        if affine:
            close(dw, rdw)
            close(db, rdb)
        rm, rv = 0.9 * rm + 0.1 * mean, 0.9 * rv + 0.1 * var
        close(bn.running_mean.numpy().reshape(-1), rm)
        close(bn.running_var.numpy().reshape(-1), rv)
        # exactly one collective per forward and one per backward, even alone
        assert fwd == {"all_reduce_sum": 0, "all_gather": 1, "broadcast": 0}
        assert bwd == {"all_reduce_sum": 1, "all_gather": 0, "broadcast": 0}


def test_momentum_none_is_cumulative_average(bn_backend):
    rng = np.random.RandomState(1)
    bn = SyncBatchNorm(3, momentum=None)
    means, vars_ = [], []
    for _ in range(3):
        x = (rng.randn(4, 3, 2, 2) * 2 + rng.randn()).astype(np.float32)
        _step(bn, x, np.zeros_like(x))
        *_, mean, var = bn_ref(x, np.zeros_like(x), np.ones(3), np.zeros(3))
        means.append(mean)
        vars_.append(var)
        close(bn.running_mean.numpy().reshape(-1), np.mean(means, axis=0))
        close(bn.running_var.numpy().reshape(-1), np.mean(vars_, axis=0))
    assert bn.num_batches_tracked == 3
    assert sorted(bn.state_dict()) == ["bias", "running_mean", "running_var", "weight"]
    bn.reset_running_stats()
    assert bn.num_batches_tracked == 0


def test_custom_momentum(bn_backend):
    rng = np.random.RandomState(2)
    bn = SyncBatchNorm(2, momentum=0.5)
    x = rng.randn(3, 2, 3, 3).astype(np.float32)
    _step(bn, x, np.zeros_like(x))
    *_, mean, var = bn_ref(x, x, np.ones(2), np.zeros(2))
    close(bn.running_mean.numpy().reshape(-1), 0.5 * mean)
    close(bn.running_var.numpy().reshape(-1), 0.5 + 0.5 * var)


@pytest.mark.parametrize("shape", [(5, 3), (2, 3, 4, 4), (2, 3, 2, 2, 2)], ids=str)
def test_eval_uses_running_stats_without_communication(bn_backend, shape):
    rng = np.random.RandomState(3)
    c = shape[1]
    bn = SyncBatchNorm(c)
    w, b, rm, rv = rng.uniform(0.5, 2, c), rng.randn(c), rng.randn(c), rng.uniform(0.5, 3, c)
    for p, v in ((bn.weight, w), (bn.bias, b), (bn.running_mean, rm), (bn.running_var, rv)):
        _set(p, v)
    bn.eval()
    x = rng.randn(*shape).astype(np.float32)
    g = rng.randn(*shape).astype(np.float32)
    y, dx, dw, db, fwd, bwd = _step(bn, x, g)
    invstd = 1.0 / np.sqrt(rv + EPS)
    xhat = (x - _cshape(x, rm)) * _cshape(x, invstd)
    axes = (0,) + tuple(range(2, x.ndim))
    close(y, xhat * _cshape(x, w) + _cshape(x, b))
    close(dx, g * _cshape(x, w * invstd))
    close(dw, (g * xhat).sum(axis=axes))
    close(db, g.sum(axis=axes))
    assert fwd["all_gather"] == 0 and sum(bwd.values()) == 0 and sum(fwd.values()) == 0
    close(bn.running_mean.numpy().reshape(-1), rm)  # untouched
    close(bn.running_var.numpy().reshape(-1), rv)


def test_no_running_stats_uses_local_batch_stats_in_eval(bn_backend):
    rng = np.random.RandomState(4)
    bn = SyncBatchNorm(3, track_running_stats=False)
    assert bn.running_mean is None and bn.running_var is None
    x = rng.randn(4, 3, 2, 2).astype(np.float32)
    g = rng.randn(4, 3, 2, 2).astype(np.float32)
    ry, rdx, *_ = bn_ref(x, g, np.ones(3), np.zeros(3))
    y, dx, _, _, fwd, bwd = _step(bn, x, g)  # train: synchronised (one collective each way)
    close(y, ry)
    close(dx, rdx)
    assert fwd["all_gather"] == 1 and bwd["all_reduce_sum"] == 1
    bn.eval()
    y, dx, _, _, fwd, bwd = _step(bn, x, g)  # eval: same batch statistics, no communication
    close(y, ry)
    close(dx, rdx)
    assert sum(fwd.values()) == 0 and sum(bwd.values()) == 0


def test_freeze_uses_running_stats_and_detaches_params(bn_backend):
    bn = SyncBatchNorm(2, freeze=True)
    _set(bn.running_mean, [1.0, -1.0])
    _set(bn.running_var, [4.0, 0.25])
    x = np.random.RandomState(5).randn(3, 2, 2, 2).astype(np.float32)
    y, dx, dw, db, fwd, _ = _step(bn, x, np.ones_like(x))
    close(y, (x - _cshape(x, [1, -1])) / np.sqrt(_cshape(x, [4, 0.25]) + EPS))
    assert sum(fwd.values()) == 0
    assert dw is None and db is None  # detached: no grads reach weight/bias
    close(dx, np.ones_like(x) / np.sqrt(_cshape(x, [4, 0.25]) + EPS))
    close(bn.running_mean.numpy().reshape(-1), [1.0, -1.0])


@pytest.mark.parametrize("cls,shape", [(M.BatchNorm2d, (4, 3, 5, 5)), (M.BatchNorm2d, (1, 2, 3, 3)),
                                       (M.BatchNorm1d, (6, 3)), (M.BatchNorm1d, (3, 2, 7))])
def test_equals_megengine_batchnorm(bn_backend, cls, shape):
    rng = np.random.RandomState(6)
    c = shape[1]
    ours, ref = SyncBatchNorm(c), cls(c)
    w, b = rng.uniform(0.5, 2, c), rng.randn(c)
    for m in (ours, ref):
        _set(m.weight, w)
        _set(m.bias, b)
    for step in range(3):
        x = (rng.randn(*shape) * 2 + 1).astype(np.float32)
        g = rng.randn(*shape).astype(np.float32)
        a, r = _step(ours, x, g), _step(ref, x, g)
        for i in range(4):
            close(a[i], r[i], tol=1e-5)
        close(ours.running_mean.numpy(), ref.running_mean.numpy(), tol=1e-6)
        close(ours.running_var.numpy(), ref.running_var.numpy(), tol=1e-6)
    ours.eval()
    ref.eval()
    x = rng.randn(*shape).astype(np.float32)
    close(ours(mge.tensor(x)).numpy(), ref(mge.tensor(x)).numpy(), tol=1e-6)


def test_state_dict_round_trip_with_batchnorm2d():
    rng = np.random.RandomState(7)
    ref = M.BatchNorm2d(4)
    for p in (ref.weight, ref.bias, ref.running_mean):
        _set(p, rng.randn(4))
    _set(ref.running_var, rng.uniform(0.5, 2, 4))
    ours = SyncBatchNorm(4)
    assert {k: v.shape for k, v in ours.state_dict().items()} == \
        {k: v.shape for k, v in ref.state_dict().items()}
    assert {k: tuple(getattr(ours, k).shape) for k in ours.state_dict()} == \
        {k: tuple(getattr(ref, k).shape) for k in ref.state_dict()}
    ours.load_state_dict(ref.state_dict(), strict=True)
    for k, v in ref.state_dict().items():
        np.testing.assert_array_equal(ours.state_dict()[k], v)
    back = M.BatchNorm2d(4)
    back.load_state_dict(ours.state_dict(), strict=True)
    for k, v in ref.state_dict().items():
        np.testing.assert_array_equal(back.state_dict()[k], v)
    x = mge.tensor(rng.randn(2, 4, 3, 3).astype(np.float32))
    ours.eval()
    ref.eval()
    close(ours(x).numpy(), ref(x).numpy(), tol=1e-6)


class _Block(M.Module):
    def __init__(self):
        super().__init__()
        self.conv = M.Conv2d(3, 4, 3, padding=1, bias=False)
        self.bn = M.BatchNorm2d(4, eps=1e-3, momentum=0.8)
        self.head = [M.Linear(4, 5), M.BatchNorm1d(5, affine=False)]
        self.extra = {"sbn": M.SyncBatchNorm(4, momentum=0.7)}

    def forward(self, x):
        x = F.relu(self.bn(self.conv(x)))
        x = self.extra["sbn"](x)
        x = F.mean(x, axis=(2, 3))
        return self.head[1](self.head[0](x))


def test_convert_and_revert():
    rng = np.random.RandomState(8)
    net = M.Sequential(_Block(), M.Identity())
    block = net[0]
    for p in (block.bn.weight, block.bn.bias, block.bn.running_mean):
        _set(p, rng.randn(4))
    _set(block.bn.running_var, rng.uniform(0.5, 2, 4))
    block.extra["sbn"].eval()
    before = {k: v.copy() for k, v in net.state_dict().items()}
    old_weight = block.bn.weight
    x = mge.tensor(rng.randn(2, 3, 4, 4).astype(np.float32))
    net.eval()
    y_before = net(x).numpy()
    net.train()
    block.extra["sbn"].eval()

    out = convert_sync_batchnorm(net)
    assert out is net
    b = net[0]
    assert type(b.bn) is SyncBatchNorm and type(b.head[1]) is SyncBatchNorm
    assert type(b.extra["sbn"]) is SyncBatchNorm
    assert b.bn.weight is old_weight  # the same Parameter objects: an optimizer keeps working
    assert (b.bn.eps, b.bn.momentum, b.bn.affine) == (1e-3, 0.8, True)
    assert b.head[1].affine is False and b.head[1].weight is None
    assert b.extra["sbn"].momentum == 0.7
    assert b.bn.training and b.head[1].training and not b.extra["sbn"].training
    assert sorted(net.state_dict()) == sorted(before)
    for k, v in net.state_dict().items():
        np.testing.assert_array_equal(v, before[k])
    names = {n for n, _ in net.named_modules()}
    assert {"0.bn", "0.head.1", "0.extra.sbn"} <= names
    net.eval()
    close(net(x).numpy(), y_before, tol=1e-5)
    net.train()
    b.extra["sbn"].eval()

    out = revert_sync_batchnorm(net)
    assert out is net
    b = net[0]
    assert type(b.bn) is M.BatchNorm2d and type(b.head[1]) is M.BatchNorm1d
    assert type(b.extra["sbn"]) is BatchNorm2d  # local BN (basebn's), not megengine's SyncBatchNorm
    assert b.bn.weight is old_weight and b.bn.eps == 1e-3 and b.bn.momentum == 0.8
    assert b.bn.training and not b.extra["sbn"].training
    for k, v in net.state_dict().items():
        np.testing.assert_array_equal(v, before[k])

    single = convert_sync_batchnorm(M.BatchNorm2d(3))  # a BN itself gives a new object
    assert type(single) is SyncBatchNorm
    reverted = revert_sync_batchnorm(SyncBatchNorm(3, momentum=None))
    assert type(reverted) is BatchNorm2d and reverted.momentum is None  # basebn's BN keeps the cumulative mode


def test_errors():
    bn = SyncBatchNorm(3)
    with pytest.raises(ValueError, match="2D to 5D"):
        bn(mge.tensor(np.zeros((3,), np.float32)))
    with pytest.raises(ValueError, match="channels"):
        bn(mge.tensor(np.zeros((2, 4), np.float32)))
    with pytest.raises(ValueError, match="more than 1 value"):
        bn(mge.tensor(np.zeros((1, 3), np.float32)))
    with pytest.raises(ValueError, match="more than 1 value"):
        bn(mge.tensor(np.zeros((0, 3, 2, 2), np.float32)))


# ---------------------------------------------------------------------------- under MPI
def _mpi_case(tmp_path, sizes, seed):
    rng = np.random.RandomState(seed)
    total = sum(sizes)
    data = {"sizes": np.array(sizes), "eps": np.array(EPS), "momentum": np.array(0.9),
            "wa": rng.uniform(0.5, 2, 3), "ba": rng.randn(3), "wb": rng.uniform(0.5, 2, 4),
            "bb": rng.randn(4),
            "xa_eval": rng.randn(total, 3, 3, 2).astype(np.float32)}
    for step in range(2):
        data[f"xa{step}"] = (rng.randn(total, 3, 3, 2) * 2 + step).astype(np.float32)
        data[f"ga{step}"] = rng.randn(total, 3, 3, 2).astype(np.float32)
        data[f"xb{step}"] = (rng.randn(total, 4) * 3 - 1).astype(np.float32)
        data[f"gb{step}"] = rng.randn(total, 4).astype(np.float32)
    np.savez(tmp_path / "in.npz", **data)
    return data


@pytest.mark.mpi
@pytest.mark.parametrize("sizes", [[1, 4], [0, 5], [3, 0, 2]], ids=lambda s: "-".join(map(str, s)))
def test_mpi_matches_single_process(tmp_path, sizes):
    data = _mpi_case(tmp_path, sizes, seed=len(sizes) * 10 + sizes[0])
    world = len(sizes)
    run_mpi(world, "-m", "tests.workers.mpi_sync_bn_worker", tmp_path)
    outs = [dict(np.load(tmp_path / f"out_{r}.npz")) for r in range(world)]
    bounds = np.concatenate([[0], np.cumsum(sizes)])

    running = {"a": (np.zeros(3), np.ones(3)), "b": []}
    for step in range(2):
        refs = {"a": bn_ref(data[f"xa{step}"], data[f"ga{step}"], data["wa"], data["ba"]),
                "b": bn_ref(data[f"xb{step}"], data[f"gb{step}"], data["wb"], data["bb"])}
        rm, rv = running["a"]
        running["a"] = (0.9 * rm + 0.1 * refs["a"][4], 0.9 * rv + 0.1 * refs["a"][5])
        running["b"].append((refs["b"][4], refs["b"][5]))
        for name, (y, dx, dw, db, mean, var) in refs.items():
            for r, out in enumerate(outs):
                lo, hi = bounds[r], bounds[r + 1]
                assert str(out["backend"]) == "mpi" and int(out["rank"]) == r
                close(out[f"y{name}{step}"], y[lo:hi])  # empty rank: shape (0, ...) both sides
                close(out[f"dx{name}{step}"], dx[lo:hi])
                assert np.all(np.isfinite(out[f"dw{name}{step}"]))
            # parameter grads are per-rank shares; their sum is the single-process grad
            close(sum(o[f"dw{name}{step}"] for o in outs), dw)
            close(sum(o[f"db{name}{step}"] for o in outs), db)
            if name == "a":
                want_m, want_v = running["a"]
            else:  # momentum=None: cumulative average of the batch statistics
                want_m = np.mean([m for m, _ in running["b"]], axis=0)
                want_v = np.mean([v for _, v in running["b"]], axis=0)
            for out in outs:
                close(out[f"rm{name}{step}"], want_m)
                close(out[f"rv{name}{step}"], want_v)
                # the combine is the same arithmetic on every rank: bit-identical running stats
                np.testing.assert_array_equal(out[f"rm{name}{step}"], outs[0][f"rm{name}{step}"])
                np.testing.assert_array_equal(out[f"rv{name}{step}"], outs[0][f"rv{name}{step}"])
        for out in outs:  # two layers: 2 all-gathers forward, 2 all-reduces backward, nothing else
            np.testing.assert_array_equal(out[f"fwd_counts{step}"], [2, 0, 0])
            np.testing.assert_array_equal(out[f"bwd_counts{step}"], [0, 2, 0])

    rm, rv = running["a"]
    x = data["xa_eval"]
    want = (x - _cshape(x, rm)) / np.sqrt(_cshape(x, rv) + EPS) * _cshape(x, data["wa"]) + _cshape(x, data["ba"])
    for r, out in enumerate(outs):
        assert int(out["eval_counts"]) == 0
        close(out["ya_eval"], want[bounds[r]:bounds[r + 1]])
