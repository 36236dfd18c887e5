"""Precise BN against population statistics computed independently in numpy."""
import numpy as np
import pytest

import megengine as mge
import megengine.functional as F
import megengine.module as M

from basebn.engine.precise_bn import collect_bn_population_stats, update_bn_stats
from mpi_launch import mpi_skip_reason, run_mpi


class TwoBN(M.Module):
    """1x1 conv -> BN -> ReLU -> 1x1 conv -> BN (GN at the end must be skipped)."""

    def __init__(self, c=3, with_gn=False):
        super().__init__()
        self.conv1, self.bn1 = M.Conv2d(2, c, 1, bias=False), M.BatchNorm2d(c)
        self.conv2, self.bn2 = M.Conv2d(c, c, 1, bias=False), M.BatchNorm2d(c)
        self.gn = M.GroupNorm(1, c) if with_gn else None

    def forward(self, x):
        x = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return self.gn(x) if self.gn is not None else x


def make_model(seed=0, with_gn=False):
    rng = np.random.default_rng(seed)
    m = TwoBN(with_gn=with_gn)
    for p in (m.conv1.weight, m.conv2.weight, m.bn1.weight, m.bn1.bias, m.bn2.weight, m.bn2.bias):
        p._reset(mge.tensor(rng.standard_normal(p.shape).astype(np.float32)))
    return m


def numpy_inputs_of_bn(model, batches):
    """Per batch, the inputs of bn1 and bn2 computed in float64 from the weights (train-mode BN)."""
    w1 = model.conv1.weight.numpy()[:, :, 0, 0].astype(np.float64)
    w2 = model.conv2.weight.numpy()[:, :, 0, 0].astype(np.float64)
    g1, b1 = model.bn1.weight.numpy().ravel(), model.bn1.bias.numpy().ravel()
    out = []
    for x in batches:
        h1 = np.einsum("oc,nchw->nohw", w1, x.astype(np.float64))
        mu, var = h1.mean(axis=(0, 2, 3)), h1.var(axis=(0, 2, 3))  # BN normalises with the biased variance
        y1 = (h1 - mu[None, :, None, None]) / np.sqrt(var[None, :, None, None] + 1e-5)
        y1 = np.maximum(y1 * g1[None, :, None, None] + b1[None, :, None, None], 0)
        out.append((h1, np.einsum("oc,nchw->nohw", w2, y1)))
    return out


def channels(xs):
    return np.concatenate([np.moveaxis(x, 1, 0).reshape(x.shape[1], -1) for x in xs], axis=1)


def make_batches(sizes, seed=1):
    rng = np.random.default_rng(seed)
    # batch means differ on purpose, so the between-batch term matters
    return [(rng.standard_normal((n, 2, 3, 3)) * (1 + i) + 2 * i).astype(np.float32) for i, n in enumerate(sizes)]


def test_pooled_statistics_match_numpy_for_two_layers():
    model = make_model()
    batches = make_batches([4, 7, 2, 5])
    ref = numpy_inputs_of_bn(model, batches)
    weights = {k: np.asarray(v).copy() for k, v in model.state_dict().items() if "running" not in k}
    result = update_bn_stats(model, [(b, np.zeros(len(b))) for b in batches], num_samples=10_000)
    assert result == {"samples": 18, "layers": 2}
    for layer, idx in ((model.bn1, 0), (model.bn2, 1)):
        allx = channels([r[idx] for r in ref])
        np.testing.assert_allclose(layer.running_mean.numpy().ravel(), allx.mean(axis=1), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(layer.running_var.numpy().ravel(), allx.var(axis=1, ddof=1), rtol=1e-4)
    for k, v in weights.items():  # weights untouched
        np.testing.assert_array_equal(np.asarray(model.state_dict()[k]), v)
    assert model.training and model.bn1.training and model.bn1.momentum == 0.9


def test_batch_average_is_the_pycls_formula_and_differs_from_pooled():
    model = make_model()
    batches = make_batches([4, 7, 2, 5])
    ref = numpy_inputs_of_bn(model, batches)
    stats = collect_bn_population_stats(model, batches, 10_000, method="batch_average")
    per_batch = [channels([r[0]]) for r in ref]
    np.testing.assert_allclose(stats["bn1"][1], np.mean([b.mean(axis=1) for b in per_batch], axis=0), rtol=1e-5)
    np.testing.assert_allclose(stats["bn1"][2], np.mean([b.var(axis=1, ddof=1) for b in per_batch], axis=0),
                               rtol=1e-5)
    pooled = collect_bn_population_stats(model, batches, 10_000)
    assert np.all(pooled["bn1"][2] > stats["bn1"][2] * 1.05)  # the between-batch variance term


def test_num_samples_cap_tensors_and_bare_images():
    model = make_model()
    batches = make_batches([4, 7, 5])
    ref = numpy_inputs_of_bn(model, [batches[0], batches[1][:2]])
    update_bn_stats(model, [mge.tensor(b) for b in batches], num_samples=6)
    allx = channels([r[0] for r in ref])
    np.testing.assert_allclose(model.bn1.running_var.numpy().ravel(), allx.var(axis=1, ddof=1), rtol=1e-4)


def test_empty_loader_keeps_statistics_and_warns():
    from loguru import logger

    model = make_model()
    before = model.bn1.running_var.numpy().copy()
    messages = []
    sink = logger.add(messages.append, level="WARNING")
    try:
        assert update_bn_stats(model, [], num_samples=100) == {"samples": 0, "layers": 0}
    finally:
        logger.remove(sink)
    np.testing.assert_array_equal(model.bn1.running_var.numpy(), before)
    assert any("no samples" in str(m) for m in messages)


def test_eval_flag_restored_and_groupnorm_skipped():
    model = make_model(with_gn=True)
    model.eval()
    gn_weight = model.gn.weight.numpy().copy()
    update_bn_stats(model, make_batches([3, 3]), 100)
    assert not model.training and not model.bn2.training
    np.testing.assert_array_equal(model.gn.weight.numpy(), gn_weight)


WORKER = """
import sys, numpy as np
sys.path.insert(0, {tests!r})
from basebn import dist
from test_precise_bn import make_model, make_batches
from basebn.engine.precise_bn import update_bn_stats
from basebn.layers import convert_sync_batchnorm
dist.init("auto")
rank = dist.get_rank()
batches = make_batches([4, 7, 2, 5])
mine = [batches[0], batches[1]] if rank == 0 else [batches[2], batches[3]]
model = make_model()
if {sync}:
    model = convert_sync_batchnorm(model)
update_bn_stats(model, mine, num_samples=10_000)
np.savez({out!r} + f"/rank{{rank}}.npz", m1=model.bn1.running_mean.numpy(), v1=model.bn1.running_var.numpy(),
         m2=model.bn2.running_mean.numpy(), v2=model.bn2.running_var.numpy())
"""


@pytest.mark.skipif(mpi_skip_reason() is not None, reason=str(mpi_skip_reason()))
@pytest.mark.parametrize("sync", [False, True])
def test_two_ranks_equal_single_process_on_the_union(tmp_path, sync):
    import os

    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(tests=os.path.dirname(__file__), out=str(tmp_path), sync=sync))
    run_mpi(2, str(script), timeout=300)
    single = make_model()
    update_bn_stats(single, make_batches([4, 7, 2, 5]), num_samples=10_000)
    r0, r1 = np.load(tmp_path / "rank0.npz"), np.load(tmp_path / "rank1.npz")
    for k in ("m1", "v1", "m2", "v2"):
        np.testing.assert_array_equal(r0[k], r1[k])  # identical on every rank
    if not sync:  # local BN: same features as single process, so the same population statistics
        np.testing.assert_allclose(r0["v1"], single.bn1.running_var.numpy(), rtol=1e-5)
        np.testing.assert_allclose(r0["v2"], single.bn2.running_var.numpy(), rtol=1e-5)
    # the first BN's input does not depend on BN, so it equals single process in both cases
    np.testing.assert_allclose(r0["m1"], single.bn1.running_mean.numpy(), rtol=1e-5, atol=1e-6)
