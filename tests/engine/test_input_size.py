"""A model that cannot run at the configured image size (a VGG or HRNet on 28 px images) fails in one line naming the
size, at model build time, in basebn.train, basebn.test and basebn.deploy (the four CLI calls share one subprocess:
tests/support/cli_batch.py)."""
import megengine.module as M
import numpy as np
import pytest

from basebn.checkpoint import save_npz_weights
from basebn.config import ConfigError
from basebn.engine import build
from basebn.models import build_model
from tests.support.cli_batch import run_mains


@pytest.mark.parametrize("name", ["vgg11_bn", "hrnet_w18_small_v1"])
def test_models_too_large_for_the_images_fail_naming_the_size(name):
    model = build_model(name, num_classes=10, in_channels=1)
    model.train()
    with pytest.raises(ConfigError, match=f"model {name} cannot run on 28x28 images"):
        build.check_input_size(model, (1, 28, 28), name)
    assert model.training  # the probe leaves the mode as it found it
    build.check_input_size(model, (1, 64, 64), name)  # both run at 64 px


class _Broken(M.Module):
    """Fails at every size."""

    def forward(self, x):
        raise RuntimeError("broken at any size")


def test_other_failures_are_not_blamed_on_the_size():
    with pytest.raises(RuntimeError, match="broken at any size") as info:
        build.check_input_size(_Broken(), (1, 28, 28), "broken")
    assert not isinstance(info.value, ConfigError)


def _one_line(r, says):
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert r.returncode == 2 and "Traceback" not in r.stderr and "backtrace" not in r.stderr, r.stderr[-3000:]
    assert len(errors) == 1 and says in errors[0], errors


def test_clis_fail_in_one_line_naming_the_size(tiny, tmp_path):
    """With the smaller of the two models (11M parameters; VGG-11's 129M take seconds to build and save each time):
    the size check is the same function for both, tested above."""
    size = ["model.name=hrnet_w18_small_v1", "model.base_width=None", "data.image_size=16"]
    weights = str(tmp_path / "w.npz")
    model = build_model("hrnet_w18_small_v1", num_classes=10, in_channels=1)
    save_npz_weights(weights, {k: np.asarray(v) for k, v in model.state_dict().items()})
    onnx = ["--format", "onnx", "-o", str(tmp_path / "m.onnx")]
    test, deploy, deploy_resized, train = run_mains([
        ("basebn.test", [tiny, *size, "-w", weights]),
        ("basebn.deploy.cli", [tiny, *size, "-w", weights, *onnx]),
        ("basebn.deploy.cli", [tiny, "model.name=hrnet_w18_small_v1", "model.base_width=None", "data.image_size=64",
                               "-w", weights, *onnx, "--input-size", "20"]),
        ("basebn.train", [tiny, *size, f"output_dir={tmp_path / 'run'}"]),  # last: it sets the process's device
    ])
    _one_line(train, "cannot run on 16x16 images")
    _one_line(test, "cannot run on 16x16 images")
    _one_line(deploy, "cannot run on 16x16 images")
    _one_line(deploy_resized, "cannot run on 20x20 images")
