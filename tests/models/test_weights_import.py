"""Weights from basecls (`basecls:` mge.save pickles) and timm (`timm:` .safetensors) give the originals' logits.

Each fixture (tests/fixtures/weights/<library>_<name>.json, written by experiments/parity/weights_parity.py) holds
the reference model's state-dict keys and shapes, the seeds, and the logits basecls's / timm's own code
computed from those weights. The test redraws the same weights with numpy, writes them as the library
does (MegEngine's own mge.save; safetensors.numpy), loads them through basebn and compares the logits.
"""
import glob
import json
import os
import pickle

import megengine as mge
import numpy as np
import pytest
from safetensors.numpy import save_file

from basebn.checkpoint import CheckpointError
from basebn.models import build_model, load_weights, read_weights
from basebn.models.convert.layout import reshapeable
from experiments.parity.weights_parity import basebn_logits, random_state, write_weights
from tests.support.initialisers import initialisers_off

FIXTURES = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "fixtures", "weights", "*.json")))
SLOW_PARAMS = 20_000_000  # cases with more parameters than this are marked slow (drawing + writing them)
TOL = 1e-4  # max abs difference of the logits (the bound)


def _load(path):
    with open(path) as f:
        return json.load(f)


def _params(fixture):
    return sum(int(np.prod(shape)) for key, shape, dtype in fixture["keys"] if dtype.startswith("float"))


def _cases():
    for path in FIXTURES:
        fx = _load(path)
        marks = [pytest.mark.slow] if _params(fx) > SLOW_PARAMS else []
        yield pytest.param(path, marks=marks, id=os.path.basename(path)[:-5])


def test_fixtures_cover_both_libraries_and_are_small():
    libraries = {_load(p)["library"] for p in FIXTURES}
    assert libraries == {"basecls", "timm"}
    assert sum(os.path.getsize(p) for p in FIXTURES) < 3 * 2 ** 20


@pytest.mark.parametrize("path", list(_cases()))
def test_logits_equal_the_original_library(tmp_path, path):
    fx = _load(path)
    state = random_state(fx["keys"], fx["weight_seed"], fx.get("gamma", (0.5, 1.5)))
    suffix = "pkl" if fx["library"] == "basecls" else "safetensors"
    weights = str(tmp_path / f"weights.{suffix}")
    write_weights(fx["library"], state, weights)
    with initialisers_off():  # every value is the file's: load_weights refuses a file that lacks a key
        logits = basebn_logits(fx["library"], fx["name"], weights, fx["input_size"], **fx["basebn_kwargs"])
    ref = np.asarray(fx["logits"], dtype=np.float32)
    assert logits.shape == ref.shape
    assert np.abs(logits - ref).max() <= TOL, (fx["library"], fx["name"])


def _resnet18_timm_state():
    fx = _load(next(p for p in FIXTURES if os.path.basename(p) == "timm_resnet18.json"))
    return random_state(fx["keys"], fx["weight_seed"])


def test_mismatch_error_lists_missing_unexpected_and_wrong_shape(tmp_path):
    state = _resnet18_timm_state()
    del state["layer2.0.bn1.running_var"]
    state["bogus.weight"] = np.zeros(3, np.float32)
    state["layer3.1.conv2.weight"] = np.zeros((256, 256, 1, 1), np.float32)
    path = str(tmp_path / "bad.safetensors")
    save_file(state, path)
    model = build_model("resnet18", num_classes=10)
    with pytest.raises(CheckpointError) as info:
        load_weights(model, f"timm:{path}")
    msg = str(info.value)
    assert "missing in the file (1): layer2.0.bn1.running_var" in msg
    assert "not in the model (1): bogus.weight" in msg
    assert "wrong shape (1): layer3.1.conv2.weight (256, 256, 1, 1) vs (256, 256, 3, 3)" in msg


def test_malicious_pickle_is_refused_and_not_run(tmp_path):
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    path = tmp_path / "evil.pkl"
    path.write_bytes(pickle.dumps({"model": {"stem.conv.weight": Payload()}}))
    model = build_model("resnet18d", num_classes=10)
    with pytest.raises(CheckpointError, match=r"refused to load global (posix|os)\.system"):
        load_weights(model, f"basecls:{path}")
    assert not marker.exists()


def test_basecls_ema_weights_saved_as_megengine_tensors(tmp_path):
    model = build_model("regnetx_002", num_classes=10)
    own = {k: np.asarray(v) for k, v in model.state_dict().items()}
    rng = np.random.default_rng(0)
    ema = {k: rng.normal(size=v.shape).astype(np.float32) for k, v in own.items()}
    path = str(tmp_path / "latest.pkl")
    mge.save({"model": own, "ema": {k: mge.Parameter(v) for k, v in ema.items()}}, path)
    state, source = read_weights(f"basecls:{path}", ema=True, model=model)
    assert source.endswith("(EMA)")
    assert state.keys() == ema.keys()
    expected = dict(ema, **{"stem.conv.weight": ema["stem.conv.weight"][:, ::-1]})  # BGR input -> RGB
    for k in ema:
        np.testing.assert_array_equal(np.asarray(state[k]).reshape(-1), expected[k].reshape(-1))


@pytest.mark.parametrize("arch, words", [("wide_resnet50_2", "2-group 3x3 convs"),
                                         ("mbnetv3_small_x075", "differs from basecls's"),
                                         ("resnet20", "timm has no CIFAR ResNets")])
def test_timm_weights_of_an_unmapped_architecture_are_refused(tmp_path, arch, words):
    path = str(tmp_path / "w.safetensors")
    save_file({"fc.weight": np.zeros((10, 4), np.float32)}, path)
    with pytest.raises(CheckpointError, match=words):
        load_weights(build_model(arch, num_classes=10), f"timm:{path}")


def test_foreign_spec_errors(tmp_path):
    model = build_model("resnet18", num_classes=10)
    with pytest.raises(CheckpointError, match="not found"):
        load_weights(model, f"timm:{tmp_path}/none.safetensors")
    bad = tmp_path / "x.safetensors"
    bad.write_bytes(b"not safetensors")
    with pytest.raises(CheckpointError, match="not a readable .safetensors"):
        load_weights(model, f"timm:{bad}")
    with pytest.raises(CheckpointError, match="needs the target model"):
        read_weights(f"timm:{bad}")


def test_layout_conversions_are_the_known_ones_only():
    assert reshapeable((8,), (1, 8, 1, 1))  # BN / bias
    assert reshapeable((8, 4, 3, 3), (2, 4, 4, 3, 3))  # grouped conv: (O, I/G, kh, kw) -> (G, O/G, I/G, kh, kw)
    assert not reshapeable((8, 4, 3, 3), (4, 8, 3, 3))  # same size, another layout
    assert not reshapeable((8,), (1, 4, 1, 2))


def test_classifier_of_another_size_is_replaced_only_when_allowed(tmp_path):
    state = _resnet18_timm_state()  # 10 classes
    path = str(tmp_path / "w.safetensors")
    save_file(state, path)
    model = build_model("resnet18", num_classes=5)
    with pytest.raises(CheckpointError, match="fc.weight"):
        load_weights(model, f"timm:{path}")
    load_weights(model, f"timm:{path}", allow_new_head=True)
    loaded = {k: np.asarray(v) for k, v in model.state_dict().items()}
    assert loaded["fc.weight"].shape == (5, 512)
    np.testing.assert_array_equal(loaded["layer4.1.conv2.weight"], state["layer4.1.conv2.weight"])
