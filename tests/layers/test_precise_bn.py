"""Precise BN against population statistics computed independently in numpy.

The reference forwards conv3x3(+bias) -> BN -> ReLU -> conv1x1 -> BN in float64 numpy from the
model's weights, each batch normalised by ITS OWN statistics in the first BN (train mode), and
computes the statistics of each BN's input straight from their definitions.
"""

import numpy as np
import pytest
from loguru import logger

import megengine as mge
import megengine.module as M

from basebn.layers.precise_bn import (bn_layers_for_precise_bn, collect_bn_population_stats, rank_quota,
                                      update_bn_stats)
from tests.support.mpi_launch import run_mpi
from tests.workers.mpi_precise_bn_worker import SCENARIOS, WEIGHT_NAMES, bn_state, build, random_weights

EPS = 1e-5


# ------------------------------------------------------------------------------ numpy reference
def conv3x3_pad1(x, w, b):
    n, _, h, wd = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((n, w.shape[0], h, wd))
    for i in range(3):
        for j in range(3):
            out += np.einsum("oc,nchw->nohw", w[:, :, i, j], xp[:, :, i:i + h, j:j + wd])
    return out + b.reshape(1, -1, 1, 1)


def bn_inputs(weights, batches):
    """Per batch, (input of bn1, input of bn2) in float64, bn1 in train mode on that batch alone."""
    w = {k: v.astype(np.float64) for k, v in weights.items()}
    out = []
    for x in batches:
        h1 = conv3x3_pad1(x.astype(np.float64), w["conv1.weight"], w["conv1.bias"])
        mu = h1.mean(axis=(0, 2, 3), keepdims=True)
        var = h1.var(axis=(0, 2, 3), keepdims=True)  # BN normalises with the biased batch variance
        y1 = (h1 - mu) / np.sqrt(var + EPS) * w["bn1.weight"].reshape(1, -1, 1, 1) + w["bn1.bias"].reshape(1, -1, 1, 1)
        h2 = np.einsum("oc,nchw->nohw", w["conv2.weight"][:, :, 0, 0], np.maximum(y1, 0))
        out.append((h1, h2))
    return out


def per_channel(xs):
    """(C, all values) of a list of (N, C, H, W) arrays."""
    return np.concatenate([np.moveaxis(x, 1, 0).reshape(x.shape[1], -1) for x in xs], axis=1)


def pooled(xs):
    v = per_channel(xs)
    return v.mean(axis=1), v.var(axis=1, ddof=1)


def batch_average(xs):
    per = [per_channel([x]) for x in xs]
    return np.mean([p.mean(axis=1) for p in per], axis=0), np.mean([p.var(axis=1, ddof=1) for p in per], axis=0)


def make_batches(sizes, seed=1, cin=2):
    rng = np.random.default_rng(seed)
    # batch means and spreads differ on purpose, so the between-batch term matters
    return [(rng.standard_normal((n, cin, 4, 4)) * (1 + 0.5 * i) + 1.5 * i).astype(np.float32)
            for i, n in enumerate(sizes)]


def assert_stats(model, layer, mean, var, rtol=2e-5):
    bn = getattr(model, layer)
    np.testing.assert_allclose(bn.running_mean.numpy().ravel(), mean, rtol=rtol, atol=1e-5, err_msg=layer)
    np.testing.assert_allclose(bn.running_var.numpy().ravel(), var, rtol=rtol, atol=1e-6, err_msg=layer)


@pytest.fixture
def weights():
    return random_weights(0)


class LogCapture:
    def __init__(self, level="INFO"):
        self.messages, self.level = [], level

    def __enter__(self):
        self.sink = logger.add(lambda m: self.messages.append(str(m)), level=self.level)
        return self

    def __exit__(self, *exc):
        logger.remove(self.sink)

    def text(self):
        return "".join(self.messages)


# ----------------------------------------------------------------------------------- pooled
def test_pooled_matches_numpy_for_two_layers(weights):
    sizes = [5, 2, 7, 3]
    batches = make_batches(sizes)
    model = build(weights)
    summary = update_bn_stats(model, [(b, np.zeros(len(b), np.int32)) for b in batches], num_samples=10_000)
    assert summary["samples"] == sum(sizes) and summary["batches"] == 4 and summary["layers"] == 2
    assert summary["method"] == "pooled" and summary["sync_bn"] == "local" and summary["untouched"] == []
    ref = bn_inputs(weights, batches)
    assert_stats(model, "bn1", *pooled([r[0] for r in ref]))
    assert_stats(model, "bn2", *pooled([r[1] for r in ref]))
    # the pooled variance = count-weighted within-batch variance + variance of the batch means
    h2 = [r[1] for r in ref]
    n = np.array([x.shape[0] * 16 for x in h2], dtype=np.float64)
    means = np.stack([per_channel([x]).mean(axis=1) for x in h2])
    m2s = np.stack([per_channel([x]).var(axis=1) * k for x, k in zip(h2, n)])
    grand = (n[:, None] * means).sum(0) / n.sum()
    decomposed = (m2s.sum(0) + (n[:, None] * (means - grand) ** 2).sum(0)) / (n.sum() - 1)
    np.testing.assert_allclose(model.bn2.running_var.numpy().ravel(), decomposed, rtol=2e-5)


def test_weights_momentum_and_flags_untouched(weights):
    model = build(weights)
    model.bn1.momentum = 0.7
    model.train()
    model.conv2.eval()  # a mixed state must come back exactly
    before = {k: np.asarray(v).copy() for k, v in model.state_dict().items() if "running" not in k}
    flags = {name: m.training for name, m in model.named_modules()}
    update_bn_stats(model, make_batches([3, 4]), 100)
    after = model.state_dict()
    for k, v in before.items():
        np.testing.assert_array_equal(np.asarray(after[k]), v, err_msg=k)
    assert {name: m.training for name, m in model.named_modules()} == flags
    assert model.bn1.momentum == 0.7 and model.bn2.momentum == 0.9
    assert all(len(m._forward_pre_hooks) == 0 for m in model.modules())  # hooks removed
    model.eval()
    update_bn_stats(model, make_batches([3, 4]), 100)
    assert not any(m.training for m in model.modules())


def test_batch_average_is_the_pycls_formula_and_misses_the_between_batch_term(weights):
    batches = make_batches([5, 2, 7, 3])
    ref = bn_inputs(weights, batches)
    model = build(weights)
    update_bn_stats(model, batches, 10_000, method="batch_average")
    assert_stats(model, "bn1", *batch_average([r[0] for r in ref]))
    assert_stats(model, "bn2", *batch_average([r[1] for r in ref]))
    # with these batch means the between-batch term matters: the pooled variance is bigger, by 1.8x
    # in some channel here
    _, pooled_var = pooled([r[0] for r in ref])
    _, avg_var = batch_average([r[0] for r in ref])
    assert np.all(pooled_var > avg_var) and np.max(pooled_var / avg_var) > 1.5
    other = build(weights)
    update_bn_stats(other, batches, 10_000)
    ratio = other.bn1.running_var.numpy().ravel() / model.bn1.running_var.numpy().ravel()
    assert np.all(ratio > 1.0) and ratio.max() > 1.5


def test_pooled_equals_batch_average_for_one_batch(weights):
    batches = make_batches([6])
    a, b = build(weights), build(weights)
    update_bn_stats(a, batches, 100)
    update_bn_stats(b, batches, 100, method="batch_average")
    for k, v in bn_state(a).items():
        np.testing.assert_allclose(v, bn_state(b)[k], rtol=1e-6, err_msg=k)


# ----------------------------------------------------------------------------- data handling
def test_empty_loader_keeps_statistics_and_warns(weights):
    model = build(weights)
    update_bn_stats(model, make_batches([4, 4]), 100)  # something other than the init values
    before = bn_state(model)
    for loader, n in (([], 100), (make_batches([3]), 0)):
        with LogCapture("WARNING") as log:
            summary = update_bn_stats(model, loader, num_samples=n)
        assert summary["samples"] == 0 and summary["layers"] == 0
        assert "no samples" in log.text()
        for k, v in bn_state(model).items():
            np.testing.assert_array_equal(v, before[k], err_msg=k)


def test_num_samples_caps_and_cuts_the_last_batch(weights):
    batches = make_batches([4, 7, 5])
    pulled = []

    def loader():
        for b in batches:
            pulled.append(len(b))
            yield mge.tensor(b)

    model = build(weights)
    summary = update_bn_stats(model, loader(), num_samples=6)
    assert summary["samples"] == 6 and summary["batches"] == 2
    assert pulled == [4, 7]  # the third batch is never fetched
    ref = bn_inputs(weights, [batches[0], batches[1][:2]])
    assert_stats(model, "bn1", *pooled([r[0] for r in ref]))
    assert_stats(model, "bn2", *pooled([r[1] for r in ref]))


def test_none_uses_everything_and_short_loaders_are_reported(weights):
    batches = make_batches([3, 4])
    model = build(weights)
    assert update_bn_stats(model, batches, None)["samples"] == 7
    with LogCapture() as log:
        assert update_bn_stats(model, batches, 100, progress=True)["samples"] == 7  # the summary line: opt-in
    assert "loader ran out" in log.text()


def test_every_batch_form_gives_the_same_statistics(weights):
    batches = make_batches([3, 5, 2])
    labels = [np.arange(len(b)) for b in batches]
    forms = {
        "tuples of numpy": [(b, y) for b, y in zip(batches, labels)],
        "bare numpy": batches,
        "bare tensors": [mge.tensor(b) for b in batches],
        "tuples of tensors": [(mge.tensor(b), mge.tensor(y)) for b, y in zip(batches, labels)],
        "lists": [[b, y, "extra"] for b, y in zip(batches, labels)],
        "dicts": [{"image": b, "label": y} for b, y in zip(batches, labels)],
    }
    results = {}
    for name, loader in forms.items():
        model = build(weights)
        update_bn_stats(model, loader, 100)
        results[name] = bn_state(model)
    ref = results["tuples of numpy"]
    for name, res in results.items():
        for k, v in res.items():
            np.testing.assert_allclose(v, ref[k], rtol=1e-6, err_msg=f"{name}: {k}")


def test_collect_returns_counts_and_writes_nothing(weights):
    batches = make_batches([5, 2, 7])
    model = build(weights)
    before = bn_state(model)
    for method, fn in (("pooled", pooled), ("batch_average", batch_average)):
        stats = collect_bn_population_stats(model, batches, 100, method=method)
        ref = bn_inputs(weights, batches)
        assert set(stats) == {"bn1", "bn2"}
        for layer, idx in (("bn1", 0), ("bn2", 1)):
            count, mean, var = stats[layer]
            assert count == 14 * 16 and mean.dtype == np.float64
            ref_mean, ref_var = fn([r[idx] for r in ref])
            np.testing.assert_allclose(mean, ref_mean, rtol=2e-5, atol=1e-5)
            np.testing.assert_allclose(var, ref_var, rtol=2e-5)
    for k, v in bn_state(model).items():
        np.testing.assert_array_equal(v, before[k], err_msg=k)


def test_a_failing_loader_leaves_the_model_as_it_was(weights):
    model = build(weights, bn2="SyncBN")
    model.eval()
    before = bn_state(model)

    def loader():
        yield make_batches([4])[0]
        raise RuntimeError("broken reader")

    with pytest.raises(RuntimeError, match="broken reader"):
        update_bn_stats(model, loader(), 100)
    for k, v in bn_state(model).items():
        np.testing.assert_array_equal(v, before[k], err_msg=k)
    assert not any(m.training for m in model.modules())
    assert "forward" not in model.bn2.__dict__ and not model.bn2.local_only  # local mode switched off again
    assert all(len(m._forward_pre_hooks) == 0 for m in model.modules())


def test_unknown_method_and_mode_raise(weights):
    with pytest.raises(ValueError, match="method"):
        update_bn_stats(build(weights), make_batches([2]), 10, method="mean")
    with pytest.raises(ValueError, match="sync_bn"):
        update_bn_stats(build(weights), make_batches([2]), 10, sync_bn="sometimes")


# -------------------------------------------------------------------------------- layer kinds
def test_groupnorm_skipped_with_one_log_line(weights):
    model = build(weights, with_gn=True)
    gn = {k: v.numpy().copy() for k, v in model.gn.named_parameters()}
    with LogCapture() as log:
        summary = update_bn_stats(model, make_batches([3, 3]), 100)
    assert summary["layers"] == 2 and summary["skipped"] == {"GroupNorm": 1}
    skip_lines = [m for m in log.messages if "skipping" in m]
    assert len(skip_lines) == 1 and "1 norm layer" in skip_lines[0] and "GroupNorm" in skip_lines[0]
    for k, v in model.gn.named_parameters():
        np.testing.assert_array_equal(v.numpy(), gn[k])


def test_frozen_bn_untouched(weights):
    model = build(weights, bn2="FrozenBN")
    model.bn2.running_mean._reset(mge.tensor(np.full((1, 4, 1, 1), 0.25, np.float32)))
    frozen = {k: np.asarray(v).copy() for k, v in model.bn2.state_dict().items()}
    batches = make_batches([4, 6])
    summary = update_bn_stats(model, batches, 100)
    assert summary["layers"] == 1 and summary["skipped"] == {"FrozenBatchNorm2d": 1}
    for k, v in model.bn2.state_dict().items():
        np.testing.assert_array_equal(np.asarray(v), frozen[k], err_msg=k)
    ref = bn_inputs(weights, batches)
    assert_stats(model, "bn1", *pooled([r[0] for r in ref]))


def test_freeze_and_untracked_bn_are_skipped():
    model = M.Sequential(M.Conv2d(2, 3, 1), M.BatchNorm2d(3, freeze=True), M.BatchNorm2d(3, track_running_stats=False),
                         M.BatchNorm2d(3))
    layers, skipped = bn_layers_for_precise_bn(model)
    assert [n for n, _ in layers] == ["3"]
    assert skipped == {"BN with freeze=True": 1, "BN without running stats": 1}
    frozen_var = model[1].running_var.numpy().copy()
    update_bn_stats(model, make_batches([3, 3]), 100)
    np.testing.assert_array_equal(model[1].running_var.numpy(), frozen_var)


def test_batchnorm1d_on_features():
    rng = np.random.default_rng(5)
    model = M.Sequential(M.Linear(3, 4), M.BatchNorm1d(4))
    batches = [(rng.standard_normal((n, 3)) + i).astype(np.float32) for i, n in enumerate([4, 6, 3])]
    update_bn_stats(model, batches, 100)
    w, b = model[0].weight.numpy().astype(np.float64), model[0].bias.numpy().astype(np.float64)
    h = np.concatenate([x.astype(np.float64) @ w.T + b for x in batches])
    np.testing.assert_allclose(model[1].running_mean.numpy().ravel(), h.mean(0), rtol=2e-5, atol=1e-5)
    np.testing.assert_allclose(model[1].running_var.numpy().ravel(), h.var(0, ddof=1), rtol=2e-5)


def test_syncbn_single_process_both_modes_equal_plain_bn(weights):
    batches = make_batches([4, 3, 5])
    plain = build(weights)
    update_bn_stats(plain, batches, 100)
    for mode in ("local", "global", "auto"):
        model = build(weights, bn1="SyncBN", bn2="SyncBN")
        summary = update_bn_stats(model, batches, 100, sync_bn=mode)
        assert summary["sync_bn"] == ("local" if mode == "auto" else mode)  # auto: one process -> local
        for k, v in bn_state(model).items():
            np.testing.assert_allclose(v, bn_state(plain)[k], rtol=1e-5, atol=1e-6, err_msg=f"{mode}: {k}")
        assert "forward" not in model.bn1.__dict__ and not model.bn1.local_only


def test_rank_quota_adds_up():
    for n, world in ((8192, 3), (10, 4), (1, 2), (0, 2)):
        quotas = [rank_quota(n, r, world) for r in range(world)]
        assert sum(quotas) == n and max(quotas) - min(quotas) <= 1
    assert rank_quota(None, 0, 2) is None


# ---------------------------------------------------------------------------------- two ranks
def _concat(*arrays):
    return np.concatenate(arrays, axis=0)


@pytest.mark.mpi
def test_two_ranks_match_single_process(tmp_path, weights):
    rng_sizes = {
        "local": ([5, 3, 6], [4]),      # rank 0 runs 3 batches, rank 1 one
        "global": ([5, 3, 6], [4, 2]),  # lockstep: 2 steps, rank 0's third batch unused
        "quota": ([4, 4, 4], [4, 4, 4]),  # num_samples=9: rank 0 takes 4 + 1, rank 1 takes 4
        "empty": ([3, 4], []),
    }
    data = {k: v for k, v in weights.items()}
    ranks = {}
    for i, (name, (s0, s1)) in enumerate(rng_sizes.items()):
        b0, b1 = make_batches(s0, seed=10 + i), make_batches(s1, seed=20 + i) if s1 else []
        b1 = [b + 0.7 for b in b1]  # the ranks' data differ in distribution
        ranks[name] = (b0, b1)
        for r, bs in enumerate((b0, b1)):
            data[f"{name}_r{r}_n"] = np.array(len(bs))
            for j, b in enumerate(bs):
                data[f"{name}_r{r}_b{j}"] = b
    np.savez(tmp_path / "in.npz", **data)
    run_mpi(2, "-m", "tests.workers.mpi_precise_bn_worker", tmp_path, timeout=400)
    out = [np.load(tmp_path / f"out_{r}.npz") for r in range(2)]
    assert int(out[0]["world"]) == 2

    # identical on both ranks, bit for bit
    for k in out[0].files:
        np.testing.assert_array_equal(out[0][k], out[1][k], err_msg=k)

    def single(name, batches, num_samples=None):
        bn1, bn2, _, _ = SCENARIOS[name]
        model = build({k: weights[k] for k in WEIGHT_NAMES}, bn1, bn2)
        update_bn_stats(model, batches, num_samples, sync_bn="local")
        return bn_state(model)

    b0, b1 = ranks["local"]
    expected = {
        # local SyncBN: each batch normalised by itself -> single process over the union
        "local": single("local", b0 + b1),
        # global: each step normalised over both ranks' batches -> single process on the concatenations
        "global": single("global", [_concat(ranks["global"][0][i], ranks["global"][1][i]) for i in range(2)]),
        "quota": single("quota", [ranks["quota"][0][0], ranks["quota"][0][1][:1], ranks["quota"][1][0]]),
        "empty": single("empty", ranks["empty"][0]),
    }
    for name, ref in expected.items():
        for k, v in ref.items():
            np.testing.assert_allclose(out[0][f"{name}.{k}"], v, rtol=1e-5, atol=1e-6, err_msg=f"{name}: {k}")
    # and against numpy for the local scenario
    numpy_ref = bn_inputs(weights, b0 + b1)
    for layer, idx in (("bn1", 0), ("bn2", 1)):
        mean, var = pooled([r[idx] for r in numpy_ref])
        np.testing.assert_allclose(out[0][f"local.{layer}.running_mean"], mean, rtol=2e-5, atol=1e-5)
        np.testing.assert_allclose(out[0][f"local.{layer}.running_var"], var, rtol=2e-5)

    o = out[0]
    assert o["local.samples"] == 18 and o["local.batches"] == 4 and list(o["local.per_rank_samples"]) == [14, 4]
    assert str(o["local.mode"]) == "local" and str(o["global.mode"]) == "global"
    assert o["global.samples"] == 5 + 3 + 4 + 2 and o["global.batches"] == 4
    assert list(o["quota.per_rank_samples"]) == [5, 4] and o["quota.samples"] == 9
    assert list(o["empty.per_rank_samples"]) == [7, 0] and o["empty.layers"] == 2
    # local mode: exactly one collective for the whole pass
    assert int(o["local.all_gather"]) == 1 and int(o["local.all_reduce_sum"]) == 0
    # collect_bn_population_stats across ranks: same numbers as update_bn_stats, nothing written
    for layer in ("bn1", "bn2"):
        assert int(o[f"collect.{layer}.count"]) == 18 * 16
        np.testing.assert_allclose(o[f"collect.{layer}.mean"], o[f"local.{layer}.running_mean"], rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(o[f"collect.{layer}.var"], o[f"local.{layer}.running_var"], rtol=1e-6)
        np.testing.assert_array_equal(o[f"collect.untouched.{layer}.running_var"], np.ones(3 if layer == "bn1" else 4))
