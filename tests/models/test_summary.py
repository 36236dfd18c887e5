"""basebn.tools.summary: MACs against a closed form on a hand-built net and against published values."""
import io
import json

import numpy as np
import megengine.functional as F
import megengine.module as M

from basebn.models import build_model
from basebn.tools.summary import main, summarize


class TinyNet(M.Module):
    def __init__(self):
        super().__init__()
        self.conv = M.Conv2d(3, 8, 3, padding=1, bias=True)
        self.bn = M.BatchNorm2d(8)
        self.dw = M.Conv2d(8, 8, 3, stride=2, padding=1, groups=4, bias=False)
        self.fc = M.Linear(8, 5)

    def forward(self, x):
        x = self.dw(F.relu(self.bn(self.conv(x))))
        return self.fc(F.mean(x, axis=(2, 3)))


def test_macs_closed_form():
    net = TinyNet()
    net.train()
    info = summarize(net, 10)
    conv = 10 * 10 * 8 * 3 * 3 * 3        # out_h * out_w * cout * cin * kh * kw
    grouped = 5 * 5 * 8 * (8 // 4) * 3 * 3  # stride 2: 5x5, cin / groups = 2
    linear = 8 * 5
    assert info["layers"] == [("conv", "conv", conv), ("dw", "conv", grouped), ("fc", "linear", linear)]
    assert info["macs"] == conv + grouped + linear
    assert info["params"] == (8 * 3 * 9 + 8) + 2 * 8 + (4 * 2 * 2 * 9) + (8 * 5 + 5)
    assert dict(info["stages"])["dw"] == (1, 8, 5, 5)
    assert net.training  # flags restored


def test_resnet50_published_values():
    info = summarize(build_model("resnet50"), 224)
    assert info["params"] == 25_557_032
    assert abs(info["macs"] / 1e9 - 4.09) < 0.01  # 4.09 G MACs (torchvision / fvcore)
    assert dict(info["stages"])["layer4"] == (1, 2048, 7, 7)


def test_mbnetv2_published_values():
    info = summarize(build_model("mbnetv2_x100"), 224)
    assert round(info["params"] / 1e6, 2) == 3.50  # 3.50 M parameters
    assert abs(info["macs"] / 1e6 - 300) < 3       # 300 M MACs (Sandler et al. 2018, Table 3)


def test_cli_table_and_json():
    out = io.StringIO()
    assert main(["mbnetv3_small_x075", "--input", "32", "--num-classes", "10"], out=out) == 0
    text = out.getvalue()
    assert "parameters" in text and "MACs" in text and "head" in text
    out = io.StringIO()
    main(["resnet20", "--json", "--num-classes", "10", "--in-channels", "1", "--input", "28"], out=out)
    info = json.loads(out.getvalue())
    assert info["name"] == "resnet20" and info["input"] == [1, 1, 28, 28]
    assert info["macs"] == summarize(build_model("resnet20", num_classes=10, in_channels=1), 28, in_channels=1)["macs"]
    np.testing.assert_equal(info["stages"][-1], ["fc", [1, 10]])
