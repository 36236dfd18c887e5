"""Fixtures shared by the deploy tests."""
import numpy as np
import pytest

from basebn.checkpoint import save_npz_weights
from basebn.config import load_config
from basebn.engine.build import build_data, build_model_from_cfg

from .helpers import randomize_bn


@pytest.fixture
def weights(tiny, tmp_path):
    """A weights file for the tiny config's model with random BN statistics."""
    cfg = load_config(tiny)
    ds, _ = build_data(cfg, train=False)
    model = randomize_bn(build_model_from_cfg(cfg, in_channels=ds.image_shape[0]))
    path = str(tmp_path / "w.npz")
    save_npz_weights(path, {k: np.asarray(v) for k, v in model.state_dict().items()})
    return path
