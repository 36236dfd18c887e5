"""engine/build.py, the one assembly point: each config -> feature switch checked against the config's
documented meaning (closed forms, the families' documented defaults), not against the builder's own code."""
import math

import numpy as np
import pytest

import megengine as mge

from basebn.config import BaseConfig
from basebn.engine.build import (build_data, build_ema, build_grad_clip, build_grad_scaler, build_model_from_cfg,
                                 build_precise_bn_loader)
from basebn.layers.norm import is_bn, set_norm_eval
from basebn.models.weight_init import last_norms


def cfg_for(name, **model):
    cfg = BaseConfig()
    cfg.merge(dict(model=dict(name=name, **model)))
    return cfg


def test_zero_init_residual_applies_to_basecls_families_and_none_keeps_the_default():
    kw = dict(in_channels=3)
    zeroed = build_model_from_cfg(cfg_for("regnetx_002", zero_init_residual=True), **kw)
    assert last_norms(zeroed) and all(np.all(n.weight.numpy() == 0) for n in last_norms(zeroed))
    default = build_model_from_cfg(cfg_for("regnetx_002"), **kw)  # None: basecls's default, off
    assert all(np.all(n.weight.numpy() == 1) for n in last_norms(default))
    resnet = build_model_from_cfg(cfg_for("resnet20", base_width=4), **kw)  # None: basebn's ResNet default, on
    assert all(np.all(n.weight.numpy() == 0) for n in last_norms(resnet))
    off = build_model_from_cfg(cfg_for("resnet20", base_width=4, zero_init_residual=False), **kw)
    assert all(np.all(n.weight.numpy() == 1) for n in last_norms(off))


def test_bn_none_reaches_the_family_default():
    cfg = cfg_for("effnet_b0_lite")
    assert cfg.bn.momentum is None and cfg.bn.eps is None
    bns = [m for m in build_model_from_cfg(cfg, in_channels=3).modules() if is_bn(m)]
    assert bns and all(m.momentum == 0.9 and m.eps == 1e-5 for m in bns)  # basecls's EfficientNet's (README)


def test_precise_bn_loader_is_built_only_when_precise_bn_runs():
    cfg = BaseConfig()
    cfg.merge(dict(batch_size=8, data=dict(name="synthetic", image_size=8, train_size=16, test_size=8,
                                           prefetch=False, num_workers=0), bn=dict(precise_every_n_epoch=1)))
    assert len(build_precise_bn_loader(cfg)) == 2
    assert build_precise_bn_loader(cfg.clone().merge({"bn": {"norm_eval": True}})) is None
    assert build_precise_bn_loader(cfg.clone().merge({"bn": {"precise_every_n_epoch": math.inf}})) is None


def test_test_batch_size_sets_the_test_split_batches_only():
    cfg = BaseConfig()
    cfg.merge(dict(batch_size=4, data=dict(name="synthetic", image_size=8, train_size=16, test_size=10,
                                           prefetch=False, num_workers=0)))
    def sizes(c, train):
        loader = build_data(c, train=train)[1]
        loader.set_epoch(0)
        return [len(images) for images, _ in loader]

    assert sizes(cfg, False) == [4, 4, 2]  # None: batch_size, the last batch partial
    five = cfg.clone().merge({"test_batch_size": 5})
    assert sizes(five, False) == [5, 5]
    assert sizes(five, True) == [4, 4, 4, 4]


def test_ema_momentum_rule():
    model = build_model_from_cfg(cfg_for("resnet20", base_width=2), in_channels=1)
    cfg = cfg_for("resnet20")
    assert build_ema(cfg, model) is None
    cfg.merge(dict(batch_size=32, solver=dict(max_epoch=4),
                   model_ema=dict(enabled=True, momentum=0.7, alpha=None, update_period=2)))
    assert build_ema(cfg, model).momentum == 0.7
    cfg.merge(dict(model_ema=dict(alpha=1e-3)))
    assert build_ema(cfg, model).momentum == pytest.approx(1 - 1e-3 * 32 / 4 * 2)  # pycls, one process


@pytest.mark.skipif(mge.is_cuda_available(), reason="the CPU fallback")
def test_amp_without_a_gpu_trains_in_float32_and_says_so():
    cfg = BaseConfig()
    assert build_grad_scaler(cfg) is None
    cfg.amp.enabled = True
    assert build_grad_scaler(cfg) is None and cfg.amp.enabled is False


def test_grad_clip():
    cfg = BaseConfig()
    assert build_grad_clip(cfg.solver.grad_clip) is None
    g = mge.Parameter(np.zeros(2, np.float32))
    g.grad = mge.tensor(np.array([3.0, -4.0], np.float32))
    build_grad_clip(cfg.clone().merge({"solver": {"grad_clip": {"name": "norm", "max_norm": 1.0}}}).solver.grad_clip)([g])
    np.testing.assert_allclose(g.grad.numpy(), [0.6, -0.8], rtol=1e-5)  # scaled to norm 1
    g.grad = mge.tensor(np.array([3.0, -4.0], np.float32))
    clip = {"name": "value", "lower": -1.0, "upper": 2.0}
    build_grad_clip(cfg.clone().merge({"solver": {"grad_clip": clip}}).solver.grad_clip)([g])
    np.testing.assert_allclose(g.grad.numpy(), [2.0, -1.0])


def test_set_norm_eval_freezes_only_bn_layers():
    model = build_model_from_cfg(cfg_for("resnet20", base_width=2), in_channels=1)
    model.train()
    set_norm_eval(model)
    assert all(m.training == (not is_bn(m)) for m in model.modules())
