"""An exported file says what it expects: the .onnx metadata_props and the .mge file's serialization metadata hold
the config's evaluation preprocessing (mean, std, channel order, input size, resize and crop, class names) for a
grey in-memory config and an RGB image-folder one; --info prints it; a file without it gets one line, exit 2.

The expected values are written out from the config texts below; the files are read with onnx and with
MegEngine's own Network.load, not with basebn's reader."""
import hashlib
import json
import os

import numpy as np
import onnx
import pytest

import megengine as mge
import megengine.module as M
from megengine import jit
from megengine.utils.network import Network

from basebn.checkpoint import save_npz_weights
from basebn.config import load_config
from basebn.deploy.cli import main as deploy_main
from basebn.deploy.preprocess_info import preprocess_info
from basebn.engine.build import build_data, build_model_from_cfg, load_trained
from tests.support.cli import write_config
from tests.support.image_folder import write_image_folder

from .helpers import randomize_bn

GREY = """
from basebn.config import BaseConfig
class Cfg(BaseConfig):
    def __init__(self):
        super().__init__()
        self.merge(dict(batch_size=16, data=dict(name="synthetic", image_size=8, train_size=32, test_size=20,
                                                 mean=(40.0,), std=(80.0,), prefetch=False),
                        model=dict(name="resnet20", base_width=4)))
"""
RGB = """
from basebn.config import BaseConfig
class Cfg(BaseConfig):
    def __init__(self):
        super().__init__()
        self.merge(dict(batch_size=6, num_classes=3,
                        data=dict(name="imagefolder", root={root!r}, image_size=16, crop_pct=0.75,
                                  interpolation="bicubic", mean=(100.0, 110.0, 120.0), std=(50.0, 60.0, 70.0),
                                  num_workers=0),
                        model=dict({model})))
"""
SYNTHETIC_NAMES = ["hbar", "vbar", "disk", "ring", "plus", "xcross", "square", "diamond", "triangle_up",
                   "triangle_down"]
# what each config's file must say (floor(16 / 0.75) = 21: the image folder's shorter side before the crop)
EXPECTED = {
    "grey": {"basebn.input_size": [8, 8], "basebn.channels": 1, "basebn.channel_order": "GRAY",
             "basebn.mean": [40.0], "basebn.std": [80.0], "basebn.pixel_range": [0, 255], "basebn.resize": 8,
             "basebn.crop": [8, 8], "basebn.interpolation": "area", "basebn.num_classes": 10,
             "basebn.class_names": SYNTHETIC_NAMES, "basebn.model": "resnet20", "basebn.dataset": "synthetic",
             "basebn.layout": "NCHW", "basebn.dtype": "float32", "basebn.input_name": "data",
             "basebn.output_name": "logits", "basebn.ema": False, "basebn.metadata_version": 1},
    "rgb": {"basebn.input_size": [16, 16], "basebn.channels": 3, "basebn.channel_order": "RGB",
            "basebn.mean": [100.0, 110.0, 120.0], "basebn.std": [50.0, 60.0, 70.0], "basebn.pixel_range": [0, 255],
            "basebn.resize": 21, "basebn.crop": [16, 16], "basebn.interpolation": "bicubic",
            "basebn.num_classes": 3, "basebn.class_names": ["cat", "dog", "emu"], "basebn.model": "resnet20",
            "basebn.dataset": "imagefolder", "basebn.layout": "NCHW", "basebn.dtype": "float32",
            "basebn.input_name": "data", "basebn.output_name": "logits", "basebn.ema": False,
            "basebn.metadata_version": 1},
}
WORDS = ("basebn.channel_order", "basebn.interpolation", "basebn.model", "basebn.dataset", "basebn.layout",
         "basebn.dtype", "basebn.input_name", "basebn.output_name", "basebn.weights", "basebn.weights_sha256")


def _config(folder, kind, model="resnet20"):
    """The path of the grey or the RGB experiment file (`model`: the RGB one's model.name)."""
    if kind == "grey":
        return write_config(folder, GREY, "grey.py")
    root = str(folder / "images")
    if not os.path.isdir(root):
        write_image_folder(root, per_class=2, size_range=(18, 30))
    model_args = f"name={model!r}" + (", base_width=4" if model == "resnet20" else "")
    return write_config(folder, RGB.format(root=root, model=model_args), f"rgb_{model}.py")


def _weights(cfg_path, folder):
    cfg = load_config(cfg_path)
    ds, _ = build_data(cfg, train=False)
    model = randomize_bn(build_model_from_cfg(cfg, in_channels=ds.image_shape[0]))
    path = str(folder / (os.path.basename(cfg_path) + ".npz"))
    save_npz_weights(path, {k: np.asarray(v) for k, v in model.state_dict().items()})
    return path


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """{kind: (weights path, {fmt: exported path})} for the grey and the RGB config, exported by the CLI."""
    folder = tmp_path_factory.mktemp("preprocess_info")
    out = {}
    for kind in EXPECTED:
        cfg_path = _config(folder, kind)
        weights = _weights(cfg_path, folder)
        files = {}
        for fmt in ("onnx", "mge"):
            files[fmt] = str(folder / f"{kind}.{fmt}")
            assert deploy_main([cfg_path, "-w", weights, "--format", fmt, "-o", files[fmt]]) == 0
        out[kind] = weights, files
    return out


def _values(strings):
    """The basebn.* strings of a file as values: JSON, except the plain words."""
    return {k: (v if k in WORDS else json.loads(v)) for k, v in strings.items() if k.startswith("basebn.")}


def _expected(kind, weights):
    with open(weights, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    return dict(EXPECTED[kind], **{"basebn.weights": weights, "basebn.weights_sha256": sha})


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_onnx_metadata_is_the_configs_preprocessing(kind, exported):
    weights, files = exported[kind]
    model = onnx.load(files["onnx"])
    assert _values({p.key: p.value for p in model.metadata_props}) == _expected(kind, weights)


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_mge_metadata_is_the_configs_preprocessing(kind, exported):
    weights, files = exported[kind]
    user_info = Network.load(files["mge"]).metadata["user_info"]
    assert _values(json.loads(user_info)) == _expected(kind, weights)


def test_info_prints_what_the_file_expects(exported, capsys):
    _, files = exported["rgb"]
    for fmt in ("onnx", "mge"):
        capsys.readouterr()
        assert deploy_main(["--info", files[fmt]]) == 0
        out = capsys.readouterr().out
        assert "expects: RGB, 16x16, input data (batch, 3, 16, 16) float32 NCHW" in out, out
        assert "resize the shorter side to 21 (bicubic) -> center-crop 16x16" in out, out
        assert "mean [100, 110, 120], std [50, 60, 70]" in out, out
        assert "output logits (batch, 3)" in out and "classes: cat, dog, emu\n" in out, out
    _, files = exported["grey"]
    assert deploy_main(["--info", files["onnx"]]) == 0
    out = capsys.readouterr().out
    assert "expects: GRAY, 8x8" in out and "mean [40], std [80]" in out and "classes: hbar, vbar, disk," in out, out


def _traced_conv_mge(path, user_info=None):
    """Write one traced conv as a .mge file at `path`, MegEngine's user_info set to `user_info`."""
    conv = M.Conv2d(1, 2, 3)

    @jit.trace(symbolic=True, capture_as_const=True)
    def infer(data):
        return conv(data)

    infer(mge.tensor(np.zeros((1, 1, 5, 5), np.float32)))
    infer.dump(path, arg_names=["data"], output_names=["logits"], user_info=user_info)
    return path


class _Marker:
    """Unpickling it would create the file `path` (os.system): what a reader of metadata must never do."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return os.system, (f"touch {self.path}",)


def _plain_files(folder):
    """An .onnx (one Identity node) and a .mge (one traced conv) written without any basebn metadata."""
    x = onnx.helper.make_tensor_value_info("data", onnx.TensorProto.FLOAT, [1, 3])
    y = onnx.helper.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, [1, 3])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Identity", ["data"], ["logits"])], "plain", [x], [y])
    onnx_path = str(folder / "plain.onnx")
    onnx.save(onnx.helper.make_model(graph), onnx_path)
    return onnx_path, _traced_conv_mge(str(folder / "plain.mge"))


def test_info_on_a_file_without_metadata_is_one_line_exit_2(tmp_path, capsys):
    for path in _plain_files(tmp_path):
        capsys.readouterr()
        assert deploy_main(["--info", path]) == 2
        captured = capsys.readouterr()
        lines = [line for line in captured.err.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error:") and "carries no basebn metadata" in lines[0], lines
        assert captured.out == ""


def test_mge_metadata_that_is_no_string_is_not_unpickled(tmp_path, capsys):
    marker = tmp_path / "unpickled"
    path = _traced_conv_mge(str(tmp_path / "evil.mge"), user_info=_Marker(marker))
    assert deploy_main(["--info", path]) == 2
    assert "carries no basebn metadata" in capsys.readouterr().err
    assert not marker.exists()


def test_info_on_a_file_that_is_no_model_is_one_line_exit_2(tmp_path, capsys):
    for name in ("junk.onnx", "junk.mge"):
        path = tmp_path / name
        path.write_bytes(b"not a model " * 8)
        assert deploy_main(["--info", str(path)]) == 2
        lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error:") and str(path) in lines[0], lines


def test_an_export_size_sets_the_resize_and_crop(tmp_path):
    cfg = load_config(_config(tmp_path, "rgb"))
    ds, loader = build_data(cfg, train=False)
    info = preprocess_info(cfg, ds, loader, (3, 12, 12))
    assert (info["basebn.input_size"], info["basebn.resize"], info["basebn.crop"]) == ([12, 12], 16, [12, 12])


def test_basecls_weights_are_recorded_and_the_input_stays_rgb(tmp_path):
    """basecls's models take BGR images; basecls: weights are converted to RGB when loaded, so the file says RGB."""
    cfg = load_config(_config(tmp_path, "rgb", model="regnetx_002"), ["data.image_size=32"])
    ds, _ = build_data(cfg, train=False)
    own = build_model_from_cfg(cfg, in_channels=3)
    path = str(tmp_path / "basecls.pkl")
    mge.save({"model": {k: np.asarray(v) for k, v in own.state_dict().items()}}, path)
    model, ds, loader = load_trained(cfg, f"basecls:{path}")
    info = preprocess_info(cfg, ds, loader, ds.image_shape, weights=f"basecls:{path}")
    with open(path, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    assert (info["basebn.channel_order"], info["basebn.mean"], info["basebn.resize"]) == ("RGB", [100.0, 110.0,
                                                                                                  120.0], 42)
    assert (info["basebn.weights"], info["basebn.weights_sha256"]) == (f"basecls:{path}", sha)
