"""A basecls name gives basecls's model, BN settings included (issue Q part 4).

The reference is basecls's own code: tests/fixtures/basecls_bn_defaults.json, written by
experiments/parity/basecls_bn_defaults.py (basecls's model functions built with their defaults, the distinct
(eps, momentum) of their BatchNorm modules recorded). The EfficientNets and MobileNetV3 used to default
to the papers' 0.99 / 1e-3 here, so basecls's and timm's weights gave other logits unless bn.eps was passed;
the logits checks replay the weights-parity fixtures (tests/fixtures/weights, basecls's / timm's own logits)
with a model built with no BN kwargs at all.
"""
import json
import os

import megengine as mge
import numpy as np
import pytest
from loguru import logger

from basebn.layers.norm import is_bn
from basebn.models import MODEL_TABLE, build_model, list_models, load_weights
from basebn.models.weights import FOREIGN_BN_EPS
from experiments.parity.weights_parity import basebn_input, random_state, write_weights
from tests.models.test_model_bn_features import REPRESENTATIVES
from tests.support import ROOT

FIXTURE = os.path.join(ROOT, "tests", "fixtures", "basecls_bn_defaults.json")
WEIGHTS = os.path.join(ROOT, "tests", "fixtures", "weights")
BASECLS = json.load(open(FIXTURE))
TOL = 1e-4  # max abs logit difference (as tests/models/test_weights_import.py)
# the families whose defaults issue Q changed: their basecls / timm fixtures, replayed without BN kwargs
CHANGED = ["basecls_effnet_b0", "basecls_effnet_b0_lite", "basecls_effnetv2_b0", "basecls_mbnetv3_small_x075",
           "basecls_mbnetv3_large_x075", "timm_effnet_b0", "timm_effnet_b0_lite"]


def _families_with_basecls_names():
    families = {}
    for name in BASECLS["bn"]:
        families.setdefault(MODEL_TABLE[name][1], []).append(name)
    return families


def _load_warnings(model, spec):
    """load_weights(model, spec); the warnings it logged."""
    warnings = []
    sink = logger.add(lambda m: warnings.append(m.record["message"]), level="WARNING")
    try:
        load_weights(model, spec)
    finally:
        logger.remove(sink)
    return warnings


def _bn_pairs(model):
    return sorted({(float(m.eps), float(m.momentum)) for m in model.modules() if is_bn(m)})


def test_fixture_covers_every_shared_name_and_is_from_a_pinned_commit():
    counts = json.load(open(os.path.join(ROOT, "tests", "fixtures", "basecls_param_counts.json")))
    assert set(BASECLS["bn"]) == set(counts["params"])  # every name basebn shares with basecls
    assert len(BASECLS["basecls_commit"]) == 40 and BASECLS["basecls_commit"] in BASECLS["command"]
    assert all(entry["count"] > 0 for entry in BASECLS["bn"].values())


@pytest.mark.parametrize("family", sorted(_families_with_basecls_names()))
def test_family_defaults_are_basecls_values(family):
    """basebn's defaults (no BN kwargs) equal basecls's for every name of the family: basecls's names of a
    family all carry one (eps, momentum), and basebn's family constructor (one norm_factory call for all its
    names) builds the family's representative with exactly that pair."""
    names = _families_with_basecls_names()[family]
    theirs = {tuple(map(tuple, BASECLS["bn"][n]["pairs"])) for n in names}
    assert len(theirs) == 1, (family, theirs)
    name, kwargs, _ = REPRESENTATIVES[family]
    assert MODEL_TABLE[name][1] == family
    assert _bn_pairs(build_model(name, num_classes=10, **kwargs)) == [tuple(p) for p in theirs.pop()]


def test_every_family_default_is_the_foreign_weights_convention():
    """Loading basecls:/timm: weights into a model built with its family default uses the source's eps: every
    family (not only basecls's names) defaults to FOREIGN_BN_EPS, so no default model needs bn.eps."""
    for family, (name, kwargs, _) in REPRESENTATIVES.items():
        eps = {e for e, _ in _bn_pairs(build_model(name, num_classes=10, **kwargs))}
        assert eps == {FOREIGN_BN_EPS}, family
    assert {MODEL_TABLE[n][1] for n in list_models()} == set(REPRESENTATIVES)


@pytest.mark.parametrize("case", CHANGED)
def test_default_model_gives_the_original_logits(tmp_path, case):
    """basecls's / timm's weights in a model built with no BN kwargs give the library's own logits."""
    fx = json.load(open(os.path.join(WEIGHTS, f"{case}.json")))
    assert fx["basebn_kwargs"] == {}
    suffix = "pkl" if fx["library"] == "basecls" else "safetensors"
    path = str(tmp_path / f"weights.{suffix}")
    write_weights(fx["library"], random_state(fx["keys"], fx["weight_seed"], fx.get("gamma", (0.5, 1.5))), path)
    model = build_model(fx["name"], num_classes=fx["num_classes"])
    assert not [w for w in _load_warnings(model, f"{fx['library']}:{path}") if "eps" in w]
    model.eval()
    logits = model(mge.tensor(basebn_input(fx["library"], size=fx["input_size"]))).numpy()
    assert np.abs(logits - np.asarray(fx["logits"], np.float32)).max() <= TOL


def test_explicit_eps_is_kept_with_the_warning(tmp_path):
    """A user who sets bn_eps keeps it when foreign weights load; the warning names the source's eps."""
    fx = json.load(open(os.path.join(WEIGHTS, "basecls_effnet_b0_lite.json")))
    path = str(tmp_path / "weights.pkl")
    write_weights("basecls", random_state(fx["keys"], fx["weight_seed"]), path)
    model = build_model("effnet_b0_lite", num_classes=fx["num_classes"], bn_eps=1e-3)
    warnings = _load_warnings(model, f"basecls:{path}")
    assert _bn_pairs(model) == [(1e-3, 0.9)]
    assert any("1e-05" in w and "0.001" in w for w in warnings), warnings
