"""basebn.tools.benchmark: runs a tiny model in eval and train mode and prints images/s and peak memory
in the documented format (no timing asserts); bad input is one line, exit 2."""
import re

import pytest

from basebn.tools.benchmark import main

LINES = [r"model resnet20  mode (eval|train)  batch 2  input 16  iters 2",
         r"throughput: \d+\.\d images/s \(\d+\.\d ms/iter\)",
         r"peak memory: \d+\.\d MiB \((GPU peak allocated|process peak RSS)\)"]


@pytest.mark.parametrize("train", [False, True])
def test_prints_throughput_and_memory(capsys, train):
    argv = ["resnet20", "--batch", "2", "--input", "16", "--iters", "2", "--warmup", "1"] + (["--train"] if train
                                                                                              else [])
    assert main(argv) == 0
    out = capsys.readouterr().out.strip().splitlines()[-3:]
    assert len(out) == 3
    for line, pattern in zip(out, LINES):
        assert re.fullmatch(pattern, line), line
    assert ("mode train" in out[0]) == train


def exit_code(argv):
    """main's exit code, also when argparse refuses an argument (SystemExit)."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


@pytest.mark.parametrize("argv, words", [(["resnet9"], "unknown model 'resnet9': did you mean resnet"),
                                         (["resnet20", "--iters", "0"], "--iters: must be in [1, "),
                                         (["vgg11_bn", "--input", "16"], "cannot run on 16x16 images")])
def test_bad_input_is_one_line(capsys, argv, words):
    assert exit_code(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[-1].startswith("error: ") and words in err[-1], err
