"""basebn's matmul op (matmul_ops) and the Linear layer on it, against float64 numpy written from the math
(y = x W^T + b, dx = dy W, dW = dy^T x, db = column sums of dy), and against megengine.module.Linear.

float32 sums of at most a few hundred terms: 1e-5 relative. Skipped when the ops did not build here.
"""
import copy
import io

import numpy as np
import pytest

import megengine as mge
import megengine.amp as amp
import megengine.functional as F
import megengine.module as M
from megengine import jit
from megengine.autodiff import GradManager

from basebn.deploy.graph import forbidden_ops, load_network
from basebn.layers import Linear
from basebn.ops import kernel_library
from basebn.layers import linear as linear_module
from basebn.layers.conv import fast_cpu_weight_grad
from basebn.ops.matmul_ops import matmul
from basebn.models import build_model
from tests.support.numerics import rel_err

TOL = 1e-5
pytestmark = pytest.mark.skipif(not kernel_library.conv_kernel_available(),
                                reason=f"oneDNN ops unavailable: {kernel_library.conv_kernel_error()}")


@pytest.fixture
def op_calls(monkeypatch):
    """How many times linear.py called the op (proves which path ran); small layers take it too."""
    monkeypatch.setattr(linear_module, "LINEAR_OP_MIN_MACS", 1)
    calls = {"n": 0}

    def counted(*a, **kw):
        calls["n"] += 1
        return matmul(*a, **kw)
    monkeypatch.setattr(linear_module, "matmul", counted)
    return calls


@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
def test_matmul_matches_float64_reference(trans_a, trans_b, with_bias):
    rng = np.random.default_rng(0)
    m, k, n = 7, 33, 5
    a = rng.standard_normal((k, m) if trans_a else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    want = (a.T if trans_a else a).astype(np.float64) @ (b.T if trans_b else b).astype(np.float64)
    if with_bias:
        want = want + bias
    got = matmul(mge.tensor(a), mge.tensor(b), trans_a, trans_b, mge.tensor(bias) if with_bias else None).numpy()
    assert got.shape == (m, n)
    assert rel_err(got, want) <= TOL


def test_matmul_non_contiguous_inputs_and_edge_sizes():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((6, 4)).astype(np.float32)
    b = rng.standard_normal((3, 6)).astype(np.float32)
    # a transposed view (4, 6) and b transposed (6, 3): non-contiguous inputs, gathered by the op
    got = matmul(mge.tensor(a).transpose(1, 0), mge.tensor(b).transpose(1, 0)).numpy()
    assert rel_err(got, a.T.astype(np.float64) @ b.T.astype(np.float64)) <= TOL
    row = np.ascontiguousarray(a.T[:1])  # (1, 6): M = 1
    one = matmul(mge.tensor(row), mge.tensor(b), trans_b=True).numpy()
    assert rel_err(one, row.astype(np.float64) @ b.T.astype(np.float64)) <= TOL
    k1 = matmul(mge.tensor(a[:, :1]), mge.tensor(b[:, :1]), trans_b=True, bias=mge.tensor(np.ones(3, np.float32)))
    assert rel_err(k1.numpy(), a[:, :1].astype(np.float64) @ b[:, :1].T.astype(np.float64) + 1) <= TOL  # K = 1


@pytest.mark.parametrize("a_shape, b_shape, kw", [
    ((3, 4), (5, 6), {}),  # inner sizes differ
    ((3, 4, 1), (4, 2), {}),  # not 2-D
    ((3, 4), (4, 2), {"bias": np.ones(3, np.float32)}),  # bias of the wrong size
])
def test_matmul_bad_shapes_raise_value_errors(a_shape, b_shape, kw):
    args = {k: mge.tensor(v) for k, v in kw.items()}
    with pytest.raises(ValueError, match="matmul"):
        matmul(mge.tensor(np.ones(a_shape, np.float32)), mge.tensor(np.ones(b_shape, np.float32)), **args)


def reference(x, w, b, dy):
    """float64 y, dx, dW, db of y = x W^T + b over the last axis of x."""
    x2, dy2 = x.reshape(-1, x.shape[-1]).astype(np.float64), dy.reshape(-1, dy.shape[-1]).astype(np.float64)
    y = x2 @ w.T.astype(np.float64) + (0 if b is None else b.astype(np.float64))
    return (y.reshape(dy.shape), (dy2 @ w.astype(np.float64)).reshape(x.shape), dy2.T @ x2,
            None if b is None else dy2.sum(0))


def run_linear(layer, x, dy):
    xp = mge.Parameter(x)
    gm = GradManager().attach([xp] + list(layer.parameters()))
    with gm:
        y = layer(xp)
        gm.backward(y, mge.tensor(dy))
    return (y.numpy(), xp.grad.numpy(), layer.weight.grad.numpy(),
            None if layer.bias is None else layer.bias.grad.numpy())


@pytest.mark.parametrize("x_shape", [(8, 12), (2, 3, 12), (12,)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_training_matches_float64_reference(x_shape, bias, op_calls):
    rng = np.random.default_rng(2)
    layer = Linear(12, 5, bias=bias)
    layer.train()
    x = rng.standard_normal(x_shape).astype(np.float32)
    dy = rng.standard_normal(x_shape[:-1] + (5,)).astype(np.float32)
    got = run_linear(layer, x, dy)
    assert op_calls["n"] == 3  # forward, dx, dW
    want = reference(x, layer.weight.numpy(), None if layer.bias is None else layer.bias.numpy(), dy)
    for name, g, w in zip(("y", "dx", "dW", "db"), got, want):
        assert (g is None) == (w is None), name
        if w is not None:
            assert g.shape == w.shape and rel_err(g, w) <= TOL, name


def test_only_the_recorded_gradients_are_computed(op_calls):
    """A frozen input (not attached) costs no dx matmul; a frozen weight no dW matmul."""
    rng = np.random.default_rng(3)
    layer = Linear(6, 4)
    layer.train()
    x = mge.tensor(rng.standard_normal((5, 6)).astype(np.float32))
    gm = GradManager().attach(layer.parameters())
    with gm:
        gm.backward(layer(x).sum())
    assert op_calls["n"] == 2  # forward, dW
    want = reference(x.numpy(), layer.weight.numpy(), layer.bias.numpy(), np.ones((5, 4), np.float32))
    assert rel_err(layer.weight.grad.numpy(), want[2]) <= TOL and rel_err(layer.bias.grad.numpy(), want[3]) <= TOL


def test_two_runs_are_bitwise_identical_at_two_threads(monkeypatch):
    monkeypatch.setenv("BASEBN_NUM_THREADS", "2")
    rng = np.random.default_rng(4)
    layer = Linear(300, 200)
    layer.train()
    x = rng.standard_normal((64, 300)).astype(np.float32)
    dy = rng.standard_normal((64, 200)).astype(np.float32)
    first, second = run_linear(layer, x, dy), run_linear(copy.deepcopy(layer), x, dy)
    for a, b in zip(first, second):
        assert np.array_equal(a, b)


def test_module_is_megengine_linear_with_its_state():
    ours, theirs = Linear(4, 3), M.Linear(4, 3)
    assert isinstance(ours, M.Linear)
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    theirs.load_state_dict(ours.state_dict())
    x = mge.tensor(np.random.default_rng(5).standard_normal((2, 4)).astype(np.float32))
    ours.train()
    assert rel_err(ours(x).numpy(), theirs(x).numpy()) <= TOL


@pytest.mark.parametrize("setup", ["eval", "megengine backend", "fast paths off", "autocast", "float16"])
def test_paths_without_the_op(setup, op_calls, monkeypatch):
    """Evaluation, the megengine conv backend, fast paths off (exporters), autocast and non-float32 tensors use
    F.linear, with the same values."""
    rng = np.random.default_rng(6)
    layer = Linear(6, 4)
    layer.train(setup != "eval")
    x = rng.standard_normal((3, 6)).astype(np.float32)
    want = x.astype(np.float64) @ layer.weight.numpy().T.astype(np.float64) + layer.bias.numpy()
    if setup == "megengine backend":
        monkeypatch.setenv("BASEBN_CONV_BACKEND", "megengine")
    if setup == "fast paths off":
        fast_cpu_weight_grad(False)
    try:
        if setup == "autocast":
            with amp.autocast():
                y = layer(mge.tensor(x))
        elif setup == "float16":
            y = F.linear(mge.tensor(x, dtype="float16"), layer.weight.astype("float16"))  # the reference call ...
            assert not linear_module.linear_op_applies(mge.tensor(x, dtype="float16"), layer.weight)  # ... not ours
            want = want - layer.bias.numpy()
        else:
            y = layer(mge.tensor(x))
    finally:
        fast_cpu_weight_grad(True)
    assert op_calls["n"] == 0
    assert rel_err(y.numpy().astype(np.float64), want) <= (2e-3 if setup in ("autocast", "float16") else TOL)


def test_a_small_layer_keeps_megengine_matmul(monkeypatch):
    """Below LINEAR_OP_MIN_MACS multiply-adds (ResNet-20's 128 x 64 -> 10 classifier) the op's fixed cost would
    exceed MegEngine's matmul: F.linear runs; at the threshold the op does."""
    calls = {"n": 0}

    def counted(*a, **kw):
        calls["n"] += 1
        return matmul(*a, **kw)
    monkeypatch.setattr(linear_module, "matmul", counted)
    layer = Linear(64, 10)
    layer.train()
    layer(mge.tensor(np.ones((128, 64), np.float32)))
    assert calls["n"] == 0 and 128 * 64 * 10 < linear_module.LINEAR_OP_MIN_MACS
    big = Linear(512, 1000)
    big.train()
    big(mge.tensor(np.ones((32, 512), np.float32)))
    assert calls["n"] == 1 and 32 * 512 * 1000 >= linear_module.LINEAR_OP_MIN_MACS


def gradients(model, x, labels):
    mge.random.seed(1)  # the same dropout masks in both models
    params = dict(model.named_parameters())
    gm = GradManager().attach(list(params.values()))
    with gm:
        gm.backward(F.nn.cross_entropy(model(mge.tensor(x)), mge.tensor(labels)))
    return {k: p.grad.numpy().copy() for k, p in params.items()}


@pytest.mark.parametrize("name, kwargs, shape", [
    ("resnet18", dict(stem="imagenet"), (4, 3, 64, 64)),
    ("mbnetv2_x100", {}, (2, 3, 64, 64)),
])
def test_model_step_matches_megengine_linear(name, kwargs, shape, op_calls):
    """A whole step of ResNet-18 / MobileNetV2 with their classifier on the op gives the gradients of the same
    model with megengine.module.Linear in its place (same weights and batch)."""
    mge.random.seed(0)
    ours = build_model(name, num_classes=10, **kwargs)
    theirs = copy.deepcopy(ours)
    fcs = [k for k, m in ours.named_modules() if isinstance(m, Linear)]
    assert fcs, "the model's classifier is basebn's Linear"
    modules = dict(theirs.named_modules())
    for k in fcs:
        parent, _, attr = k.rpartition(".")
        owner = modules[parent] if parent else theirs
        old = getattr(owner, attr)
        plain = M.Linear(old.in_features, old.out_features, bias=old.bias is not None)
        plain.load_state_dict(old.state_dict())
        setattr(owner, attr, plain)
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    rng = np.random.default_rng(7)
    x, labels = rng.standard_normal(shape).astype(np.float32), rng.integers(0, 10, shape[0]).astype(np.int32)
    got = gradients(ours, x, labels)
    assert op_calls["n"] == 3 * len(fcs)
    want = gradients(theirs, x, labels)
    # a BN whose output feeds another train-mode BN has a zero bias gradient in exact arithmetic: float32 leaves
    # ~1e-6 noise there, so each error is taken relative to its parameter's gradient or 1% of the largest one
    scale = max(np.abs(w).max() for w in want.values())
    for k in want:
        err = np.abs(got[k].astype(np.float64) - want[k]).max()
        assert err <= 1e-4 * max(np.abs(want[k]).max(), 1e-2 * scale), k


def test_symbolic_trace_of_training_holds_megengine_matmul(op_calls):
    """A jit.trace(symbolic=True) graph of a training-mode Linear holds MegEngine's MatrixMul and no custom op."""
    layer = Linear(6, 4)
    layer.train()

    @jit.trace(symbolic=True, capture_as_const=True)
    def infer(data):
        return layer(data)

    x = np.random.default_rng(8).standard_normal((3, 6)).astype(np.float32)
    y = infer(mge.tensor(x)).numpy()
    buf = io.BytesIO()
    infer.dump(buf, arg_names=["data"])
    assert op_calls["n"] == 0
    assert forbidden_ops(load_network(buf.getvalue())) == []
    assert rel_err(y, x.astype(np.float64) @ layer.weight.numpy().T.astype(np.float64) + layer.bias.numpy()) <= TOL
