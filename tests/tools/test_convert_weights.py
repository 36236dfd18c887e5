"""basebn.tools.convert_weights: a timm .safetensors file -> basebn's .npz, which `-w` loads to the same
numbers; bad input is one line, exit 2."""
import json
import os

import numpy as np
import pytest
from safetensors.numpy import save_file

from basebn.models import build_model, load_weights
from basebn.tools.convert_weights import main
from experiments.parity.weights_parity import random_state

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "fixtures", "weights", "timm_resnet18.json")


def _timm_resnet18_state():
    """Random weights in timm's own resnet18 keys and PyTorch shapes (num_classes 10), from its fixture."""
    with open(FIXTURE) as f:
        fx = json.load(f)
    return random_state(fx["keys"], fx["weight_seed"])


def test_converts_timm_file_to_npz_that_loads(tmp_path, capsys):
    state = _timm_resnet18_state()
    assert "bn1.num_batches_tracked" in state and state["bn1.weight"].shape == (64,)
    src, out = str(tmp_path / "w.safetensors"), str(tmp_path / "w.npz")
    save_file(state, src)
    assert main([f"timm:{src}", "--arch", "resnet18", "--num-classes", "10", "-o", out]) == 0
    assert "wrote" in capsys.readouterr().out
    fresh = build_model("resnet18", num_classes=10)
    load_weights(fresh, out)
    loaded = {k: np.asarray(v) for k, v in fresh.state_dict().items()}
    assert set(loaded) == {k for k in state if not k.endswith("num_batches_tracked")}
    for k, v in loaded.items():
        np.testing.assert_array_equal(v.reshape(-1), state[k].reshape(-1))


@pytest.mark.parametrize("args, words", [
    (["timm:/no/such.safetensors", "--arch", "resnet18"], "not found"),
    (["timm:x.safetensors", "--arch", "resnet9"], "unknown --arch 'resnet9'"),
    (["timm:x.safetensors", "--arch", "resnet18", "-o", "x.pkl"], "ending in .npz"),
])
def test_bad_input_is_one_line(tmp_path, monkeypatch, capsys, args, words):
    monkeypatch.chdir(tmp_path)
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and words in err[-1]
