"""What basebn.test --adapt refuses or warns about: a model without BN layers, --episodic with --save-adapted,
a destination that cannot take the file (refused before the adaptation runs), small batches for batch statistics;
and a write that fails at the end: one line about that file, the metrics kept, exit 1."""
import errno
import json
import os
import sys

import megengine.module as M
import numpy as np
import pytest
from loguru import logger

from basebn import test as test_cli
from basebn.checkpoint import model_state, save_npz_weights
from basebn.config import ConfigError, load_config
from basebn.engine import adapt_eval
from basebn.engine.adapt_eval import AdaptOptions, check_adapt_options, evaluate_with_adaptation
from basebn.engine.build import build_model_from_cfg
from tests.engine.test_adapt import TwoLayer, _batches, _model
from tests.support.cli import TINY, write_config


@pytest.fixture(autouse=True)
def _logging_restored():
    """basebn.test.main points loguru at the test's captured stderr: give later tests the plain sink back."""
    yield
    logger.remove()
    logger.add(sys.stderr)


def _loader(n_batches=2, n=6):
    return [(x, np.zeros(len(x), np.int32)) for x in _batches(n_batches=n_batches, n=n)]


def _weights(tmp_path, *overrides):
    """(config path, weights file) of TINY's ResNet-20 with `overrides`, freshly initialised."""
    cfg = write_config(tmp_path, TINY)
    weights = str(tmp_path / "w.npz")
    save_npz_weights(weights, model_state(build_model_from_cfg(load_config(cfg, list(overrides)), in_channels=1)))
    return cfg, weights


def _error_lines(text):
    return [line for line in text.splitlines() if line.startswith("error:")]


# ----------------------------------------------------------------------------------------- no BN layers
def test_adabn_on_a_group_norm_model_is_refused_and_writes_nothing(tmp_path, capsys):
    cfg, weights = _weights(tmp_path, "model.norm=GN")
    out = tmp_path / "adapted.npz"
    code = test_cli.main([cfg, "-w", weights, "model.norm=GN", "--adapt", "adabn", "--save-adapted", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    assert _error_lines(err) == ["error: adabn needs BN layers to adapt; this model has none (its norm layers are "
                                 "not BatchNorm2d): evaluate it without --adapt"], err
    assert not out.exists()


def test_bn_batch_on_a_model_without_bn_is_refused_as_tent_is():
    model = TwoLayer(norm=lambda channels, eps: M.GroupNorm(2, channels, eps=eps))
    for method in ("bn_batch", "adabn", "tent"):
        with pytest.raises(ConfigError, match=rf"^{method} needs BN layers"):
            evaluate_with_adaptation(model, _loader(), 6, AdaptOptions(method=method))


# ----------------------------------------------------------------------------------------- option refusals
def test_episodic_with_save_adapted_is_refused(tmp_path):
    options = AdaptOptions(method="tent", episodic=True, save_to=str(tmp_path / "a.npz"))
    with pytest.raises(ConfigError, match="episodic tent goes back to the source weights before every batch, so "
                                          "there are no adapted weights to save"):
        check_adapt_options(options)


@pytest.mark.parametrize("lr", [float("nan"), float("inf"), -1e-3, 11.0])
def test_a_non_finite_or_out_of_range_lr_is_refused_by_the_api_too(lr):
    with pytest.raises(ConfigError, match=r"--adapt-lr must be a finite number in \[0, 10\]"):
        check_adapt_options(AdaptOptions(method="tent", lr=lr))


# ----------------------------------------------------------------------------------------- the destination
def test_a_destination_under_a_file_is_named_as_such(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    options = AdaptOptions(method="adabn", save_to=str(tmp_path / "notes.txt" / "a.npz"))
    with pytest.raises(ConfigError, match=r"notes\.txt' is a file, not a folder"):
        check_adapt_options(options)


@pytest.mark.skipif(not os.path.isdir("/sys/class"), reason="needs Linux's sysfs (no regular file can be made there)")
def test_a_folder_that_takes_no_file_is_refused_before_the_adaptation(tmp_path, capsys):
    """sysfs refuses a new file even to root (chmod would not stop root, who runs some CIs)."""
    cfg, weights = _weights(tmp_path)
    code = test_cli.main([cfg, "-w", weights, "--adapt", "adabn", "--save-adapted", "/sys/adapted.npz"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    lines = _error_lines(err)
    assert len(lines) == 1 and lines[0].startswith("error: --save-adapted '/sys/adapted.npz': cannot write a file in "
                                                    "folder '/sys'"), err
    assert "adapt adabn:" not in err  # refused before the model was loaded and adapted


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_a_read_only_folder_is_refused(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        with pytest.raises(ConfigError, match="cannot write a file in folder"):
            check_adapt_options(AdaptOptions(method="adabn", save_to=str(folder / "a.npz")))
        assert os.listdir(folder) == []
    finally:
        folder.chmod(0o700)


def test_the_writability_probe_leaves_nothing_behind(tmp_path):
    check_adapt_options(AdaptOptions(method="adabn", save_to=str(tmp_path / "a.npz")))
    assert os.listdir(tmp_path) == []


# ----------------------------------------------------------------------------------------- a write failing at the end
def test_a_write_failing_at_the_end_keeps_the_metrics(tmp_path):
    from basebn.engine.adapt_eval import AdaptedSaveError

    out = tmp_path / "a.npz"
    options = AdaptOptions(method="adabn", save_to=str(out))
    check_adapt_options(options)
    out.mkdir()  # what the check saw changed while the adaptation ran: the name is now taken by a folder
    with pytest.raises(AdaptedSaveError) as info:
        evaluate_with_adaptation(_model(), _loader(), 6, options)
    assert info.value.metrics["images"] == 12
    message = str(info.value)
    assert message.startswith(f"could not write the adabn-adapted weights to {str(out)!r}")
    assert "checkpoint" not in message and "--resume" not in message


def test_a_full_disk_at_the_end_is_one_line_about_the_file_and_exit_1(tmp_path, capsys, monkeypatch):
    cfg, weights = _weights(tmp_path)
    out = str(tmp_path / "adapted.npz")

    def disk_full(path, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

    monkeypatch.setattr(adapt_eval, "save_npz_weights", disk_full)
    code = test_cli.main([cfg, "-w", weights, "--adapt", "adabn", "--save-adapted", out, "--json"])
    captured = capsys.readouterr()
    assert code == 1, captured.err
    assert _error_lines(captured.err) == [
        f"error: could not write the adabn-adapted weights to {out!r} (No space left on device); the evaluation "
        f"finished (its metrics are printed) and no file was written: fix the folder or free space and run again"]
    assert json.loads(captured.out.strip().splitlines()[-1])["images"] == 37  # the metrics were not lost
    assert not os.path.exists(out)


# ----------------------------------------------------------------------------------------- small batches
@pytest.mark.parametrize("method", ["bn_batch", "tent"])
def test_batch_statistics_from_few_images_are_warned_about(warnings, method):
    evaluate_with_adaptation(_model(), _loader(n=2), 2, AdaptOptions(method=method))
    lines = [w for w in warnings if "unreliable" in w]
    assert lines == [f"adapt {method}: each batch is normalised by its own statistics, and batch statistics from 2 "
                     f"image(s) are unreliable (accuracy can fall far below --adapt none); use batch_size=16 or more "
                     f"(TENT uses 200)"], warnings


def test_no_small_batch_warning_from_16_images_or_for_adabn(warnings):
    evaluate_with_adaptation(_model(), _loader(n=16), 16, AdaptOptions(method="bn_batch"))
    evaluate_with_adaptation(_model(), _loader(n=2), 2, AdaptOptions(method="adabn"))
    assert not [w for w in warnings if "unreliable" in w], warnings
