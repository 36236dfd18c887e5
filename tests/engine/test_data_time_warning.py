"""The trainer says once, naming data.num_workers and the data_speed tool, when waiting for data takes longer
than the step; the first iteration of an epoch (loader start-up) is not counted."""
import types

import megengine.module as M
import megengine.optimizer as optim
from loguru import logger

from basebn.config import load_config
from basebn.engine.build import build_trainer


def make_trainer(tmp_path):
    cfg_file = tmp_path / "c.py"
    cfg_file.write_text("from basebn.config import BaseConfig\nclass Cfg(BaseConfig):\n    pass\n")
    model = M.Linear(3, 4)
    loader = types.SimpleNamespace(num_workers=3, __len__=lambda: 3)
    t = build_trainer(load_config(str(cfg_file)), model, [None] * 3, optim.SGD(model.parameters(), lr=0.1))
    t.dataloader = loader
    return t


def feed(t, timings):
    warnings = []
    sink = logger.add(lambda m: warnings.append(str(m)), level="WARNING", format="{message}")
    try:
        for it, (data, step) in enumerate(timings):
            t.progress = types.SimpleNamespace(iter=it % 10 + 1, epoch=1)
            t._watch_data_time(data, step)
    finally:
        logger.remove(sink)
    return warnings


def test_warns_once_when_data_is_the_bottleneck(tmp_path):
    warnings = feed(make_trainer(tmp_path), [(0.3, 0.1)] * 30)
    assert len(warnings) == 1
    assert "data.num_workers (now 3)" in warnings[0] and "basebn.tools.data_speed" in warnings[0]
    assert "0.300s waiting for data vs 0.100s per step" in warnings[0]


def test_quiet_when_only_the_epoch_start_waits(tmp_path):
    timings = [(5.0 if i % 10 == 0 else 0.01, 0.1) for i in range(40)]  # iteration 1 of each epoch is slow
    assert feed(make_trainer(tmp_path), timings) == []
