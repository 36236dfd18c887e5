"""bn_report writes its report to -o or the current directory, never beside a weights file (a zoo folder's), and
says where."""
import os

from basebn.checkpoint import model_state, save_npz_weights
from basebn.models import build_model
from basebn.tools import bn_report


def test_report_of_a_weights_file_goes_to_the_current_directory(tmp_path, monkeypatch, capsys):
    zoo, here, chosen = tmp_path / "zoo", tmp_path / "here", tmp_path / "chosen"
    zoo.mkdir()
    here.mkdir()
    weights = zoo / "w.npz"
    save_npz_weights(str(weights), model_state(build_model("resnet20", num_classes=10, in_channels=1, base_width=4)))
    monkeypatch.chdir(here)
    assert bn_report.main([str(weights), "--data-samples", "0"]) == 0
    assert os.listdir(zoo) == ["w.npz"]
    assert {"bn_report.txt", "bn_report.json"} <= set(os.listdir(here))
    assert f"wrote {here}{os.sep}bn_report.txt" in capsys.readouterr().out
    assert bn_report.main([str(weights), "--data-samples", "0", "-o", str(chosen)]) == 0
    assert {"bn_report.txt", "bn_report.json"} <= set(os.listdir(chosen))
    assert f"wrote {chosen}{os.sep}bn_report.txt" in capsys.readouterr().out
    assert os.listdir(zoo) == ["w.npz"]
