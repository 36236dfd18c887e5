"""The BASEBN_* variables: every one read anywhere in basebn/ has a rule in the one table, a bad value of each is one
line (exit 2) from a CLI, and the kernels' thread bound is the CLIs' one."""
import os
import re
import subprocess
import sys

import pytest

from basebn.tools import summary
from basebn.utils.cli_args import MAX_THREADS
from basebn.utils.env_vars import ENV_VARS, EnvVarError, check_environment, env_problems
from tests.support import ROOT

PACKAGE = os.path.join(ROOT, "basebn")
_NAME = r"BASEBN_[A-Z0-9_]*[A-Z0-9]"


def _sources():
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith((".py", ".cpp", ".h", ".cu", ".cuh")):
                with open(os.path.join(folder, name)) as f:
                    yield name, f.read()


def _names_in_sources():
    """(every BASEBN_ name, those read from the environment, those that are C preprocessor macros)."""
    every, read, macros = set(), set(), set()
    for name, text in _sources():
        every |= set(re.findall(_NAME, text))
        if name.endswith(".py"):  # a whole string literal: os.environ.get("BASEBN_X"), _ENV = "BASEBN_X"
            read |= set(re.findall(r"[\"'](" + _NAME + r")[\"']", text))
        else:
            read |= set(re.findall(r"getenv\(\s*\"(" + _NAME + r")\"", text))
            macros |= set(re.findall(r"#\s*(?:define|ifdef|ifndef|undef)\s+(" + _NAME + ")", text))
            macros |= set(re.findall(r"defined\s*\(?\s*(" + _NAME + ")", text))
        macros |= set(re.findall(r"-D(" + _NAME + ")", text))  # compile flags, in build code and comments
    return every, read, macros


def test_every_environment_variable_in_the_sources_has_a_rule():
    every, read, macros = _names_in_sources()
    assert read == set(ENV_VARS), "read but without a rule: {}; a rule but never read: {}".format(
        sorted(read - set(ENV_VARS)), sorted(set(ENV_VARS) - read))
    assert every - read - macros == set()  # no BASEBN_ name that is neither
    assert read & macros == set()


# a value each rule refuses, from what its reader does (hand-written); BASEBN_ONEDNN_ROOT accepts any path
ANY_VALUE = {"BASEBN_ONEDNN_ROOT"}


@pytest.fixture
def bad_values(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    return {
        "BASEBN_BASECLS_URL": "ftp//mirror",
        "BASEBN_BN_BACKEND": "bogus",
        "BASEBN_CACHE": str(a_file),
        "BASEBN_CONV_BACKEND": "bogus",
        "BASEBN_DATA_CACHE": str(a_file / "below"),  # a path under a file can never be created
        "BASEBN_KERNEL_CACHE": str(a_file),
        "BASEBN_KERNEL_CUDA": "no",
        "BASEBN_KERNEL_DIR": str(tmp_path / "missing"),
        "BASEBN_KERNEL_PORTABLE": "yes",
        "BASEBN_NUM_THREADS": "100000",
        "BASEBN_SELFCHECK": "off",
        "BASEBN_TUNE_CPU": "no",
        "BASEBN_ZOO": str(a_file),
        "BASEBN_BN_TRAIN_PLAN": "columns",
        "BASEBN_CONV_DEPTHWISE": "off",
        "BASEBN_CONV_PLAIN_1X1": "1",
    }


def test_a_bad_value_of_each_variable_is_one_line_naming_it(bad_values):
    assert set(bad_values) | ANY_VALUE == set(ENV_VARS)
    for name, value in bad_values.items():
        assert [bad[0] for bad in env_problems({name: value})] == [name]
        with pytest.raises(EnvVarError) as err:
            check_environment({name: value})
        line = str(err.value)
        assert "\n" not in line and f"{name}={value!r}" in line and ENV_VARS[name].accepted in line


@pytest.mark.parametrize("value", ["100000", "1025", "0", "-2", "abc", "4x", "2.5"])
def test_num_threads_outside_the_bound_of_every_thread_argument_is_refused(value):
    assert [bad[0] for bad in env_problems({"BASEBN_NUM_THREADS": value})] == ["BASEBN_NUM_THREADS"]


def test_accepted_values_pass(tmp_path):
    good = {"BASEBN_NUM_THREADS": str(MAX_THREADS), "BASEBN_BN_BACKEND": " Fallback", "BASEBN_CONV_BACKEND": "auto",
            "BASEBN_CACHE": str(tmp_path / "not" / "yet"), "BASEBN_KERNEL_CACHE": str(tmp_path),
            "BASEBN_KERNEL_DIR": str(tmp_path), "BASEBN_BASECLS_URL": "http://127.0.0.1:8000/",
            "BASEBN_ONEDNN_ROOT": str(tmp_path / "no-onednn"), "BASEBN_SELFCHECK": "0", "BASEBN_KERNEL_CUDA": "0",
            "BASEBN_ZOO": "", "OTHER": "anything"}  # empty: unset
    assert env_problems(good) == []
    check_environment(good)


def test_the_kernels_thread_bound_is_max_threads():
    with open(os.path.join(PACKAGE, "ops", "csrc", "thread_env.h")) as f:
        bound = re.search(r"kMaxEnvThreads = (\d+);", f.read()).group(1)
    assert int(bound) == MAX_THREADS


def test_a_cli_refuses_bad_variables_in_one_line_before_anything_runs(bad_values, tmp_path):
    """One real CLI (basebn.test, whose BASEBN_BN_BACKEND=bogus was a traceback), every bad variable at once."""
    env = dict(os.environ, PYTHONPATH=ROOT, **bad_values)
    r = subprocess.run([sys.executable, "-m", "basebn.test", str(tmp_path / "exp.py")], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert all(f"{name}={value!r}" in lines[0] for name, value in bad_values.items()), lines[0]


def test_summary_checks_the_variables_too(monkeypatch, capsys):
    monkeypatch.setenv("BASEBN_CONV_BACKEND", "bogus")
    assert summary.main(["resnet20"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "BASEBN_CONV_BACKEND='bogus'" in err[0]
