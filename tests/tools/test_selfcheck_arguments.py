"""selfcheck --devices takes 1 to MAX_DEVICES GPU processes; anything else is one line, exit 2, before any check."""
import pytest

from basebn.tools import selfcheck


@pytest.mark.parametrize("value", ["-1", "0", "100000", "two"])
def test_bad_device_counts_are_one_line(capsys, value):
    with pytest.raises(SystemExit) as info:
        selfcheck.main(["--devices", value])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: argument --devices: ") and value in err[0], err
