"""python -m basebn.tools.data_speed: images/s of the training loader, --json last line, one-line errors."""
import json

import pytest

from basebn.tools.data_speed import main
from tests.support.cli import run
from tests.support.image_folder import folder_config


def last_json(out):
    return json.loads(out.strip().splitlines()[-1])


def test_image_folder_with_workers_prints_images_per_second(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("BASEBN_DATA_CACHE", str(tmp_path / "cache"))
    cfg, _ = folder_config(tmp_path)  # 18 training images, batch 6: 3 batches per epoch
    assert main([cfg, "data.num_workers=2", "batch_size=4", "--batches", "5", "--json"]) == 0
    out = capsys.readouterr().out
    result = last_json(out)
    assert set(result) == {"images_per_s", "workers", "batch_size", "batches", "seconds"}
    assert result["workers"] == 2 and result["batch_size"] == 4 and result["batches"] == 5
    assert result["images_per_s"] == pytest.approx(5 * 4 / result["seconds"], rel=0.01)
    assert "images/s" in out.splitlines()[0]


def test_in_memory_config_in_process(tiny, capsys):
    assert main([tiny, "data.num_workers=0", "--batches", "3", "--json"]) == 0
    result = last_json(capsys.readouterr().out)
    assert result["workers"] == 0 and result["batch_size"] == 16 and result["images_per_s"] > 0


def test_cli_errors_are_one_line(tiny):
    r = run(["basebn.tools.data_speed", tiny, "data.num_workers=-1"])
    assert r.returncode == 2 and "data.num_workers" in r.stderr and "Traceback" not in r.stderr
