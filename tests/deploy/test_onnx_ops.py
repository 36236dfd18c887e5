"""The ONNX mapping op by op: small modules using each activation, pooling, reduction and shape op the model
families trace to, exported and run in onnxruntime (the peer) against MegEngine's eager output; the ONNX
model's declared form (opset, IR version, symbolic dims, 1-D conv bias, full checker); unmapped ops fail.
Tolerance 1e-5, times the largest |logit| when that is above 1."""
import numpy as np
import onnx
import pytest

import megengine.functional as F
import megengine.module as M

from basebn.deploy import ExportError, export_onnx, max_abs_difference, run_exported
from basebn.layers import AdaptiveAvgPool2d, build_activation, channel_shuffle, shuffle_split
from basebn.layers.activation import ACTIVATIONS
from basebn.models import build_model

from .helpers import images, randomize_bn, scaled_tolerance

TOLERANCE = 1e-5


class ActivationNet(M.Module):
    def __init__(self, act):
        super().__init__()
        self.conv = M.Conv2d(3, 4, 3, padding=1)
        self.bn = M.BatchNorm2d(4)
        self.act = build_activation(act)
        self.fc = M.Linear(4, 5)

    def forward(self, x):
        return self.fc(F.flatten(F.mean(self.act(self.bn(self.conv(x))), axis=(2, 3)), 1))


class PoolNet(M.Module):
    def __init__(self):
        super().__init__()
        self.conv = M.Conv2d(3, 6, 3, stride=2, padding=1, groups=3)
        self.max = M.MaxPool2d(3, stride=2, padding=1)
        self.adaptive_matrices = AdaptiveAvgPool2d(3)  # 5 -> 3: pooling matrices
        self.adaptive_pool = AdaptiveAvgPool2d(3)  # 9 -> 3: avg_pool

    def forward(self, x):
        y = self.conv(x)
        a = F.avg_pool2d(y, 3, 2, 1, mode="average")  # counts padding
        b = F.avg_pool2d(y, 3, 2, 1)  # excludes padding
        c = self.adaptive_matrices(self.max(y))
        return F.concat([F.flatten(a + b, 1), F.flatten(c, 1), F.flatten(self.adaptive_pool(y), 1)], axis=1)


class ShapeNet(M.Module):
    def __init__(self):
        super().__init__()
        self.conv = M.Conv2d(3, 8, 1)
        self.fc = M.Linear(8, 4)

    def forward(self, x):
        y = self.conv(x)
        even, odd = shuffle_split(y)  # reshape with computed shape, index on axis 2
        z = channel_shuffle(F.concat([odd, even * 2], axis=1), 4)  # reshape + transpose
        half = z[:, : z.shape[1] // 2]  # slice with a computed end
        every_other = z[:, 1::2, :, -1]  # step slice, negative index
        pooled = F.sum(half, axis=(2, 3)) + F.max(every_other, axis=2)
        t = F.transpose(z, (0, 2, 3, 1)).reshape(z.shape[0], -1, 8)  # (N, HW, C)
        gram = F.matmul(t, self.fc.weight.T)  # batched matmul with a constant
        return self.fc(F.concat([pooled, F.mean(z, axis=(2, 3))[:, :4]], axis=1)) + gram.mean(axis=1)


def _export(model, tmp_path, shape):
    path = str(tmp_path / "m.onnx")
    traced = export_onnx(model, path, shape)
    return path, traced


@pytest.mark.parametrize("act", sorted(ACTIVATIONS))
def test_activation_matches_eager(act, tmp_path):
    model = randomize_bn(ActivationNet(act))
    path, _ = _export(model, tmp_path, (2, 3, 8, 8))
    x = images((3, 3, 8, 8))
    assert max_abs_difference(model, path, x) <= scaled_tolerance(model, x, TOLERANCE)


@pytest.mark.parametrize("net", [PoolNet, ShapeNet])
def test_pooling_and_shape_ops_match_eager(net, tmp_path):
    model = net()
    path, _ = _export(model, tmp_path, (2, 3, 18, 18))
    x = images((5, 3, 18, 18))
    assert max_abs_difference(model, path, x) <= scaled_tolerance(model, x, TOLERANCE)


def test_declared_form_symbolic_dims_and_folded_bias(tmp_path):
    model = randomize_bn(build_model("resnet20", num_classes=10, in_channels=1, base_width=4))
    path, traced = _export(model, tmp_path, (2, 1, 16, 16))
    proto = onnx.load(path)
    onnx.checker.check_model(proto, full_check=True)
    assert proto.ir_version == 8 and [(o.domain, o.version) for o in proto.opset_import] == [("", 17)]
    dims = [d.dim_param or d.dim_value for d in proto.graph.input[0].type.tensor_type.shape.dim]
    assert proto.graph.input[0].name == "data" and dims == ["batch", 1, "height", "width"]
    assert proto.graph.output[0].name == "logits"
    convs = [n for n in proto.graph.node if n.op_type == "Conv"]
    inits = {i.name: i for i in proto.graph.initializer}
    assert len(convs) == 21 and all(len(n.input) == 3 and len(inits[n.input[2]].dims) == 1 for n in convs)
    assert not [n for n in proto.graph.node if n.op_type in ("BatchNormalization", "Add") and n.input[0] in inits]
    # free batch and image size: other shapes run and match the eager model
    for shape in ((1, 1, 16, 16), (4, 1, 24, 20)):
        x = images(shape)
        assert max_abs_difference(model, path, x) <= scaled_tolerance(model, x, TOLERANCE)


def test_size_dependent_graph_keeps_a_fixed_image_size(tmp_path):
    """AdaptiveAvgPool2d bakes the input size into the graph: height and width are declared as numbers."""
    model = PoolNet()
    path, traced = _export(model, tmp_path, (2, 3, 18, 18))
    assert not traced.spatial_free
    dims = [d.dim_param or d.dim_value for d in onnx.load(path).graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["batch", 3, 18, 18]


class Resize(M.Module):
    def forward(self, x):
        return F.flatten(F.vision.interpolate(x, scale_factor=2.0), 1)


def test_an_op_without_mapping_fails_naming_it(tmp_path):
    with pytest.raises(ExportError, match=r"no ONNX mapping for MegEngine operator .* of type \w+"):
        _export(Resize(), tmp_path, (2, 3, 4, 4))
    assert not (tmp_path / "m.onnx").exists()


def test_run_exported_and_threads(tmp_path):
    model = ActivationNet("relu")
    path, _ = _export(model, tmp_path, (2, 3, 8, 8))
    x = images((2, 3, 8, 8))
    np.testing.assert_allclose(run_exported(path, x, threads=1), run_exported(path, x, threads=2), rtol=0, atol=1e-6)
