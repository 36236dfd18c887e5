"""A run directory wherever a config is taken: basebn.test RUN_DIR evaluates with the run's own config and weights,
basebn.train RUN_DIR --resume continues a stopped run without its overrides, a config the weights do not match gets
one line; the trainer's log interval and lr-schedule warning in the run's log."""
import json
import os
import re
import signal
import subprocess
import time

import pytest

from basebn.checkpoint import CheckpointError, load_checkpoint
from basebn.config import load_config
from basebn.engine.build import load_trained
from tests.support import ROOT
from tests.support.cli import PY, TINY, metrics, run

# what TINY does not set: width, image size, epochs; a warm-up as long as the run; 8 iterations per epoch with a
# log interval longer than the epoch
RUN_OVERRIDES = ["model.base_width=6", "data.image_size=12", "solver.max_epoch=3", "solver.warmup_epochs=3",
                 "data.train_size=128", "log_every_n_iter=100"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(tiny config path, run directory) of one uninterrupted run with RUN_OVERRIDES."""
    folder = tmp_path_factory.mktemp("run_dir_cli")
    tiny = folder / "tiny.py"
    tiny.write_text(TINY)
    run_dir = str(folder / "run")
    r = run(["basebn.train", str(tiny), f"output_dir={run_dir}", *RUN_OVERRIDES])
    assert r.returncode == 0, r.stderr
    return str(tiny), run_dir


def last_json(stdout):
    return json.loads(stdout.strip().splitlines()[-1])


def test_test_cli_on_a_run_dir_reproduces_its_recorded_metrics(trained):
    _, run_dir = trained
    recorded = metrics(run_dir)[-1]
    assert recorded["epoch"] == 3
    r = run(["basebn.test", run_dir, "--json"])  # no override, no -w: the run's config and final weights
    assert r.returncode == 0, r.stderr
    got = last_json(r.stdout)
    assert got["images"] == recorded["images"] == 37
    assert got["top1"] == recorded["top1"] and got["top5"] == recorded["top5"]
    assert got["loss"] == pytest.approx(recorded["loss"], rel=1e-6)
    assert "trained with" not in r.stderr  # nothing differs from the recorded config


def test_a_runs_config_json_is_accepted(trained, capsys):
    from basebn.test import main

    _, run_dir = trained
    assert main([os.path.join(run_dir, "config.json"), "--json"]) == 0
    got = last_json(capsys.readouterr().out)
    recorded = metrics(run_dir)[-1]
    assert got["top1"] == recorded["top1"] and got["loss"] == pytest.approx(recorded["loss"], rel=1e-6)


def test_weights_given_with_a_config_they_do_not_fit_are_refused_in_one_line(trained):
    tiny, run_dir = trained
    r = run(["basebn.test", tiny, "-w", run_dir])  # the experiment file without the run's overrides
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and r.stderr.rstrip().endswith(errors[0]), r.stderr
    assert "trained with model.base_width=6 (the config gives 4)" in errors[0]
    assert "data.image_size=12 (the config gives 8)" in errors[0]


def test_weights_that_fit_another_image_size_load_with_one_warning_line(trained, warnings):
    _, run_dir = trained
    load_trained(load_config(run_dir, ["data.image_size=16"]), run_dir)
    said = [line for line in warnings if "trained with" in line]
    assert len(said) == 1 and "\n" not in said[0], warnings
    assert "trained with data.image_size=12, the config gives data.image_size=16" in said[0]


def test_another_model_name_is_refused_naming_the_recorded_one(trained):
    _, run_dir = trained
    with pytest.raises(CheckpointError) as info:
        load_trained(load_config(run_dir, ["model.name=resnet32"]), run_dir)
    line = str(info.value)
    assert "\n" not in line and "trained with model.name='resnet20' (the config gives 'resnet32')" in line


def test_short_epochs_log_four_times_and_the_whole_run_warmup_is_one_warning(trained):
    _, run_dir = trained
    log = open(os.path.join(run_dir, "log.txt")).read()
    # log_every_n_iter=100 and 8 iterations an epoch: a line every 8 // 4 = 2 iterations
    assert re.findall(r"epoch 1/3 iter (\d+)/8 ", log) == ["2", "4", "6", "8"]
    warned = [line for line in log.splitlines() if "the warm-up never ends" in line]
    assert len(warned) == 1 and "solver.warmup_epochs=3 >= solver.max_epoch=3" in warned[0]


def test_train_run_dir_resume_finishes_a_sigtermed_run(trained, tmp_path):
    tiny, _ = trained
    run_dir = str(tmp_path / "stopped")
    longer = [*RUN_OVERRIDES, "data.train_size=480"]  # 30 iterations an epoch: time to stop it before the last
    proc = subprocess.Popen([PY, "-m", "basebn.train", tiny, f"output_dir={run_dir}", *longer], cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=ROOT), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not os.path.exists(os.path.join(run_dir, "latest.npz")) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=300) == 128 + signal.SIGTERM  # stopped before its last epoch
    assert not os.path.exists(os.path.join(run_dir, "final.npz"))
    r = run(["basebn.train", run_dir, "--resume"])  # none of the overrides typed again
    assert r.returncode == 0, r.stderr
    assert [m["epoch"] for m in metrics(run_dir)] == [1, 2, 3]
    final = load_checkpoint(os.path.join(run_dir, "final.npz"))
    assert final["epoch"] == 3
    assert final["config"]["model"]["base_width"] == 6 and final["config"]["data"]["image_size"] == 12
    assert final["config"]["data"]["train_size"] == 480
