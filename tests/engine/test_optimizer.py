"""InplaceSGD against SGD written in numpy from its formulas and against MegEngine's own SGD; param_groups."""
import numpy as np
import pytest

import megengine as mge
import megengine.functional as F
import megengine.module as M
import megengine.optimizer as optim
from megengine.autodiff import GradManager

from basebn.engine.optimizer import InplaceSGD, param_groups
from basebn.layers.batch_norm import BatchNorm2d

SHAPES = [(4, 3, 3, 3), (4,), (1, 4, 1, 1)]


def numpy_sgd(params, grads_per_step, lr, momentum, wds, nesterov):
    """SGD in float64 from its formulas (per-parameter weight decay ``wds``):
    g += wd * p; v = m * v + g; p -= lr * (g + m * v if nesterov else v)."""
    params = [p.astype(np.float64) for p in params]
    bufs = [np.zeros_like(p) for p in params]
    for grads in grads_per_step:
        for i, g in enumerate(grads):
            g = g + wds[i] * params[i]
            if momentum:
                bufs[i] = momentum * bufs[i] + g
                g = g + momentum * bufs[i] if nesterov else bufs[i]
            params[i] = params[i] - lr * g
    return params, bufs


def run(cls, init, grads_per_step, **kw):
    params = [mge.Parameter(p) for p in init]
    opt = cls([{"params": params[:2], "weight_decay": kw.pop("wd")}, {"params": params[2:], "weight_decay": 0.0}],
              **kw)
    for grads in grads_per_step:
        for p, g in zip(params, grads):
            p.grad = mge.tensor(g)
        opt.step()
        opt.clear_grad()
    return [p.numpy() for p in params], opt


@pytest.mark.parametrize("momentum,nesterov,wd", [(0.9, False, 5e-4), (0.9, True, 1e-2), (0.0, False, 1e-2),
                                                   (0.5, False, 0.0)])
def test_inplace_sgd_matches_numpy_and_megengine(momentum, nesterov, wd):
    rng = np.random.default_rng(0)
    init = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    grads = [[rng.standard_normal(s).astype(np.float32) for s in SHAPES] for _ in range(3)]
    kw = dict(lr=0.1, momentum=momentum, nesterov=nesterov)
    ours, opt = run(InplaceSGD, init, grads, wd=wd, **kw)
    theirs, _ = run(optim.SGD, init, grads, wd=wd, **kw)
    ref_params, ref_bufs = numpy_sgd(init, grads, 0.1, momentum, [wd, wd, 0.0], nesterov)  # 2 decayed params
    for a, b, r in zip(ours, theirs, ref_params):
        np.testing.assert_allclose(a, r, rtol=0, atol=1e-5)
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    if momentum:
        state = opt.state_dict()
        bufs = [state["state"][i]["momentum_buffer"] for i in range(len(SHAPES))]
        for b, r in zip(bufs, ref_bufs):
            np.testing.assert_allclose(np.asarray(b), r, rtol=0, atol=1e-5)


@pytest.mark.parametrize("momentum,nesterov", [(0.9, False), (0.9, True), (0.0, False)])
def test_many_parameters_some_without_grad(momentum, nesterov):
    """19 parameters in two groups, two without a gradient (left as they are), one gradient non-contiguous: every
    parameter and buffer as numpy's."""
    rng = np.random.default_rng(2)
    shapes = [(5,), (70000,), (3, 4), (2, 3, 3, 3), (1,)] * 3 + [(7, 2), (2,), (4, 4), (3,)]
    init = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    no_grad = {3, 11}
    params = [mge.Parameter(p) for p in init]
    opt = InplaceSGD([{"params": params[:10], "weight_decay": 1e-2}, {"params": params[10:], "weight_decay": 0.0}],
                   lr=0.05, momentum=momentum, nesterov=nesterov)
    wds = [1e-2] * 10 + [0.0] * 9
    steps = [[rng.standard_normal(s).astype(np.float32) for s in shapes] for _ in range(3)]
    for grads in steps:
        for i, (p, g) in enumerate(zip(params, grads)):
            if i in no_grad:
                continue
            p.grad = mge.tensor(np.ascontiguousarray(g.T)).transpose(1, 0) if i == 2 else mge.tensor(g)  # (3, 4) view
        opt.step()
        opt.clear_grad()
    ref_params, ref_bufs = numpy_sgd([p for i, p in enumerate(init) if i not in no_grad],
                                     [[g for i, g in enumerate(gs) if i not in no_grad] for gs in steps], 0.05,
                                     momentum, [w for i, w in enumerate(wds) if i not in no_grad], nesterov)
    got = [p.numpy() for i, p in enumerate(params) if i not in no_grad]
    for a, r in zip(got, ref_params):
        np.testing.assert_allclose(a, r, rtol=0, atol=1e-5)
    for i in no_grad:
        np.testing.assert_array_equal(params[i].numpy(), init[i])
    if momentum:
        state = opt.state_dict()["state"]
        bufs = [np.asarray(state[i]["momentum_buffer"]) for i in range(len(shapes)) if i not in no_grad]
        for b, r in zip(bufs, ref_bufs):
            np.testing.assert_allclose(b, r, rtol=0, atol=1e-5)


def test_parameters_stay_attached_after_steps():
    """The update writes the parameters in place: the module and the GradManager keep training the same Parameter
    objects, and the loss falls."""
    rng = np.random.default_rng(4)
    net = M.Linear(6, 3)
    ids = [id(p) for p in net.parameters()]
    gm = GradManager().attach(net.parameters())
    opt = InplaceSGD(net.parameters(), lr=0.1, momentum=0.9)
    x = mge.tensor(rng.standard_normal((16, 6)).astype(np.float32))
    y = mge.tensor(rng.integers(0, 3, 16).astype(np.int32))
    losses = []
    for _ in range(5):
        with gm:
            loss = F.nn.cross_entropy(net(x), y)
            gm.backward(loss)
        assert all(p.grad is not None for p in net.parameters())
        opt.step()
        opt.clear_grad()
        losses.append(float(loss.item()))
    assert [id(p) for p in net.parameters()] == ids
    assert losses[-1] < losses[0]


def test_state_dict_loads_into_megengine_sgd_and_continues_the_same():
    rng = np.random.default_rng(1)
    init = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    grads = [[rng.standard_normal(s).astype(np.float32) for s in SHAPES] for _ in range(2)]
    _, ours = run(InplaceSGD, init, grads[:1], wd=1e-3, lr=0.1, momentum=0.9)
    params = [mge.Parameter(p) for p in init]
    theirs = optim.SGD([{"params": params[:2], "weight_decay": 1e-3}, {"params": params[2:], "weight_decay": 0.0}],
                       lr=0.1, momentum=0.9)
    theirs.load_state_dict(ours.state_dict())
    assert sorted(theirs.state_dict()["state"]) == sorted(ours.state_dict()["state"])


def test_param_groups_exclude_bn_and_biases():
    net = M.Sequential(M.Conv2d(3, 4, 3, bias=True), BatchNorm2d(4), M.Linear(4, 2))
    decay, other = param_groups(net, 1e-4)
    assert {id(p) for p in decay["params"]} == {id(net[0].weight), id(net[2].weight)}
    assert {id(p) for p in other["params"]} == {id(net[0].bias), id(net[1].weight), id(net[1].bias), id(net[2].bias)}
    assert (decay["weight_decay"], other["weight_decay"]) == (1e-4, 0.0)
