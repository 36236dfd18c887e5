"""--resume checks the run's latest.npz against the model from its .npy headers: a member that cannot fit (a gigabyte
of zeros compressing to a megabyte) is refused in one line before any array is read, as weights files are."""
import os
from types import SimpleNamespace

import pytest

from basebn.checkpoint import CheckpointError
from basebn.train import _resume
from tests.checkpoint.test_weights_fit import BIG, _member, _state_members, _tiny_model, _write_zip, no_array_read

__all__ = ["no_array_read"]  # the fixture, used by name below


def test_resume_refuses_a_latest_that_cannot_fit_before_reading_it(tmp_path, no_array_read):
    model = _tiny_model()
    members = _state_members(model, skip=("conv1.weight",))
    members["model/conv1.weight.npy"] = _member(shape=(BIG,))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    _write_zip(str(run_dir / "latest.npz"), members)
    assert os.path.getsize(run_dir / "latest.npz") < 4 << 20
    with pytest.raises(CheckpointError) as info:
        _resume(SimpleNamespace(model=model, cfg=None), str(run_dir))
    message = str(info.value)
    assert "\n" not in message and "does not fit this model" in message
    assert f"model/conv1.weight is ({BIG},) float32 in the file, {tuple(model.conv1.weight.shape)} float32" in message
