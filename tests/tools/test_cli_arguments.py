"""Every CLI number argument is range-checked in one line (exit 2), and the small CLI defects of issue R:
`summary --help` cut mid-sentence, "overrides" named as required, no closest-name hint, MegEngine's CPU banner."""
import pytest

from basebn import test as test_cli
from basebn import train as train_cli
from basebn.tools import benchmark, convert_weights, data_speed, plot, summary
from tests.support.cli import run

MAINS = {"train": train_cli.main, "test": test_cli.main, "benchmark": benchmark.main, "data_speed": data_speed.main,
         "summary": summary.main, "plot": plot.main, "convert_weights": convert_weights.main}


def exit_code(main, argv):
    """main's exit code, also when argparse refuses an argument (SystemExit)."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


# (CLI, argv, flag named in the error): each number below or above its range, or not a whole number
BAD_NUMBERS = [
    ("train", ["cfg.py", "--devices", "0"], "--devices"),
    ("train", ["cfg.py", "--devices", "100000"], "--devices"),
    ("train", ["cfg.py", "--devices", "two"], "--devices"),
    ("train", ["cfg.py", "--num-machines", "0"], "--num-machines"),
    ("train", ["cfg.py", "--machine-rank", "-1"], "--machine-rank"),
    ("test", ["cfg.py", "-w", "x.npz", "--threads", "0"], "--threads"),
    ("test", ["cfg.py", "-w", "x.npz", "--threads", "1000000"], "--threads"),
    ("benchmark", ["resnet20", "--batch", "0"], "--batch"),
    ("benchmark", ["resnet20", "--batch", "1000000000"], "--batch"),
    ("benchmark", ["resnet20", "--input", "7"], "--input"),
    ("benchmark", ["resnet20", "--input", "1000000"], "--input"),
    ("benchmark", ["resnet20", "--iters", "0"], "--iters"),
    ("benchmark", ["resnet20", "--warmup", "-1"], "--warmup"),
    ("benchmark", ["resnet20", "--batch", "2.5"], "--batch"),
    ("data_speed", ["cfg.py", "--batches", "0"], "--batches"),
    ("summary", ["resnet20", "--input", "0"], "--input"),
    ("summary", ["resnet20", "--input", "100000"], "--input"),
    ("summary", ["resnet20", "--num-classes", "0"], "--num-classes"),
    ("summary", ["resnet20", "--num-classes", "10000000000"], "--num-classes"),
    ("summary", ["resnet20", "--in-channels", "0"], "--in-channels"),
    ("summary", ["resnet20", "--in-channels", "100000"], "--in-channels"),
    ("plot", ["run", "--num-samples", "0"], "--num-samples"),
    ("convert_weights", ["timm:x.safetensors", "--arch", "resnet18", "--num-classes", "0"], "--num-classes"),
    ("convert_weights", ["timm:x.safetensors", "--arch", "resnet18", "--num-classes", "10000000000"], "--num-classes"),
]


@pytest.mark.parametrize("cli, argv, flag", BAD_NUMBERS, ids=[f"{c}:{' '.join(a[-2:])}" for c, a, _ in BAD_NUMBERS])
def test_every_number_argument_is_range_checked_in_one_line(capsys, cli, argv, flag):
    assert exit_code(MAINS[cli], argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and flag in err[0], err
    assert "must be in [" in err[0] or "expects a whole number in [" in err[0], err


@pytest.mark.parametrize("cli", ["train", "test", "data_speed"])
def test_missing_config_is_named_not_the_overrides(capsys, cli):
    assert exit_code(MAINS[cli], []) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: missing CONFIG"), err
    assert "overrides" not in err[0] and "KEY=VALUE" not in err[0]


def test_summary_help_is_whole_sentences(capsys):
    assert exit_code(summary.main, ["--help"]) == 0
    out = capsys.readouterr().out
    assert "the output shape of each top-level stage" in " ".join(out.split())  # was cut after "shape of"
    assert 'as pycls / fvcore report "flops").' in out


def test_summary_unknown_model_is_one_line_with_the_closest_names(capsys):
    assert exit_code(summary.main, ["resnet5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown model 'resnet5': did you mean resnet" in err[0] and "resnet50," in err[0], err


def test_summary_model_that_cannot_run_at_the_size_is_one_line(capsys):
    assert summary.main(["vgg11_bn", "--input", "16", "--num-classes", "10"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot run on 16x16 images" in err[0], err


def test_summary_prints_no_megengine_banner():
    r = run(["basebn.tools.summary", "resnet20", "--input", "32", "--num-classes", "10"])
    assert r.returncode == 0, r.stderr
    assert "parameters" in r.stdout
    assert "CUDA" not in r.stderr and "failed to load cuda func" not in r.stderr, r.stderr
