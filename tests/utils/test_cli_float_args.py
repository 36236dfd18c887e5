"""No float argument of any basebn CLI takes nan or inf: the parsers are found by walking the package for command-line
modules, and the float arguments by what their types accept."""
import argparse
import importlib
import importlib.util
import pkgutil

import pytest

import basebn

NON_FINITE = ["nan", "NaN", "-nan", "inf", "-inf", "Infinity", "1e999", "-1e999"]
NUMBERS = ["0", "1", "0.5", "1e-3", "-1", "100", "1e6"]


class _Captured(BaseException):
    """Raised by the patched parser instead of parsing (a BaseException: cli_main passes it through)."""

    def __init__(self, parser):
        super().__init__()
        self.parser = parser


def _cli_modules():
    """Names of the basebn modules run as `python -m NAME` (they end in `if __name__ == "__main__"`)."""
    names = []
    for info in pkgutil.walk_packages(basebn.__path__, prefix="basebn."):
        if info.name.endswith(".__main__"):
            continue  # runs its CLI on import; the module it calls is in the list itself
        with open(importlib.util.find_spec(info.name).origin, encoding="utf-8") as f:
            if 'if __name__ == "__main__"' in f.read():
                names.append(info.name)
    return sorted(names)


CLI_MODULES = _cli_modules()


def _parser_of(module_name, monkeypatch):
    """The ArgumentParser `module_name`.main builds (captured at its first parse)."""
    def capture(self, *args, **kwargs):
        raise _Captured(self)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", capture)
    with pytest.raises(_Captured) as info:
        importlib.import_module(module_name).main([])
    return info.value.parser


def _all_actions(parser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _all_actions(sub)
        else:
            yield action


def _takes_floats(convert):
    """Whether an argparse `type=` turns some number text into a float."""
    if convert is float:
        return True
    for text in NUMBERS:
        try:
            value = convert(text)
        except (argparse.ArgumentTypeError, TypeError, ValueError):
            continue
        if isinstance(value, float):
            return True
    return False


def _float_arguments(parser):
    return [a for a in _all_actions(parser) if callable(a.type) and _takes_floats(a.type)]


def test_the_walk_finds_the_clis():
    assert {"basebn.test", "basebn.train", "basebn.deploy.cli"} <= set(CLI_MODULES)
    assert sum(name.startswith("basebn.tools.") for name in CLI_MODULES) >= 5, CLI_MODULES


def _accepts(convert, text):
    try:
        convert(text)
    except (argparse.ArgumentTypeError, TypeError, ValueError):
        return False
    return True


@pytest.mark.parametrize("module_name", CLI_MODULES)
def test_no_float_argument_takes_nan_or_inf(module_name, monkeypatch):
    for action in _float_arguments(_parser_of(module_name, monkeypatch)):
        flag = "/".join(action.option_strings) or action.dest
        accepted = [text for text in NON_FINITE if _accepts(action.type, text)]
        assert not accepted, f"python -m {module_name} {flag} accepts {accepted}"


def test_float_arguments_exist_and_are_checked(monkeypatch):
    """The walk sees float arguments at all (basebn.test's --adapt-lr among them), so the test above is not empty."""
    found = {a.dest for name in CLI_MODULES for a in _float_arguments(_parser_of(name, monkeypatch))}
    assert "adapt_lr" in found


@pytest.mark.parametrize("text", ["nan", "inf", "-1", "11", "abc"])
def test_adapt_lr_out_of_range_is_one_line(capsys, text):
    from basebn import test as test_cli

    with pytest.raises(SystemExit) as info:
        test_cli.main(["cfg.py", "-w", "x.npz", "--adapt", "tent", "--adapt-lr", text])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: argument --adapt-lr: ") and "[0, 10]" in err[0], err


def test_bounded_float_accepts_its_interval_and_nothing_else():
    from basebn.utils.cli_args import bounded_float

    convert = bounded_float(0.0, 10.0)
    assert [convert(t) for t in ("0", "1e-3", "10", "2.5")] == [0.0, 1e-3, 10.0, 2.5]
    for text in ["-1e-9", "10.000001", "nan", "inf", "", "1,5"]:
        with pytest.raises(argparse.ArgumentTypeError):
            convert(text)
