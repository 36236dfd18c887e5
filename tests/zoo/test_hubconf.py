"""hubconf.py as MegEngine Hub runs it after fetching a repository (issue Q part 3): loaded with MegEngine Hub's
own module loader (``megengine.hub.tools.load_module``), its dependencies checked by the hub's own check, its
entry points listed by ``hub.list``'s rule and called; no network (basecls's weights come from the local server
of tests/models/test_basecls_names.py, serving a file basecls's code wrote)."""
import json
import os

import megengine as mge
import numpy as np
import pytest
from megengine.hub.hub import _check_dependencies
from megengine.hub.tools import load_module

from basebn.models import list_models
from basebn.zoo import get_entry, read_npz_weights, zoo_weights_path
from tests.models.test_basecls_names import FIXTURE, mirror, server  # noqa: F401  (pytest fixtures)
from tests.support import ROOT


@pytest.fixture(scope="module")
def hub():
    return load_module("hubconf", os.path.join(ROOT, "hubconf.py"))


def test_one_entry_point_per_model_name_and_dependencies_present(hub):
    listed = [n for n in dir(hub) if not n.startswith("__") and callable(getattr(hub, n))]  # megengine.hub.list's rule
    assert sorted(listed) == sorted(list_models())
    _check_dependencies(hub)  # raises RuntimeError naming what is missing


def test_plain_entry_builds_the_model(hub):
    model = hub.regnetx_002(num_classes=7)
    assert model.arch_name == "regnetx_002" and model.head.fc.weight.shape == (7, 368)


def test_pretrained_takes_the_zoo_entry_where_there_is_one(hub):
    model = hub.resnet20(pretrained=True)
    first = json.load(open(os.path.join(ROOT, "zoo", "zoo.json")))["entries"][0]["name"]
    ref, _, _ = read_npz_weights(zoo_weights_path(get_entry(first)))
    own = model.state_dict()
    assert set(ref) <= set(own)
    for key, value in ref.items():
        np.testing.assert_array_equal(np.asarray(own[key]), value, err_msg=key)


def test_pretrained_takes_basecls_weights_otherwise(hub, mirror):  # noqa: F811
    model = hub.mbnetv1_x025(pretrained=True, num_classes=FIXTURE["num_classes"])
    rgb = np.random.default_rng(FIXTURE["input_seed"]).uniform(
        -2, 2, size=(FIXTURE["batch"], 3, FIXTURE["size"], FIXTURE["size"])).astype(np.float32)
    model.eval()
    assert np.abs(model(mge.tensor(rgb)).numpy() - np.asarray(FIXTURE["logits"], np.float32)).max() <= 1e-4


def test_pretrained_without_published_weights_says_so(hub):
    with pytest.raises(ValueError, match="neither basebn's zoo nor basecls"):
        hub.wrn_16_8(pretrained=True)
