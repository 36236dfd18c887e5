"""Issue R: weights files that would exhaust memory are refused with one CheckpointError before anything large is
allocated (.npz members: declared sizes; legacy pickles: lengths, shapes and counts given to admitted globals)."""
import io
import os
import pickle
import subprocess
import sys
import zipfile

import numpy as np
import pytest

import basebn.checkpoint.format as container
from basebn.checkpoint import CheckpointError, load_legacy_checkpoint, read_container, save_npz_weights
from tests.support import ROOT
from tests.support.cli import TINY

HUGE = 1 << 40  # 1 TiB: no test machine has it


def _npz_with_member(path, name, header, payload):
    """An .npz whose member `name` has the .npy `header` dict and `payload` bytes (whatever the header says)."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, header)
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(name, buf.getvalue() + payload)


def test_npz_member_declaring_a_huge_array_is_refused(tmp_path):
    path = str(tmp_path / "bomb.npz")
    _npz_with_member(path, "model/w.npy", {"descr": "<f4", "fortran_order": False, "shape": (HUGE,)}, b"\0" * 64)
    with pytest.raises(CheckpointError, match="declares an array of 4398046511104 bytes"):
        read_container(path)


def test_npz_decompressing_beyond_memory_is_refused(tmp_path, monkeypatch):
    """np.savez_compressed of 8 MB of zeros is a ~8 kB file; with the memory budget lowered to 1 MB it is refused
    from the zip's declared sizes (the real budget, this machine's memory, is what a real zip bomb exceeds)."""
    path = str(tmp_path / "zeros.npz")
    np.savez_compressed(path, **{"model/w": np.zeros(2 << 20, np.float32)})
    assert os.path.getsize(path) < 100_000
    assert sorted(read_container(path)[0]) == ["model/w"]  # within the real budget it loads
    monkeypatch.setattr(container, "memory_budget_bytes", lambda: 1 << 20)
    with pytest.raises(CheckpointError, match="would decompress to .* more than this machine's memory"):
        read_container(path)


def test_normal_weights_still_load(tmp_path):
    path = str(tmp_path / "w.npz")
    save_npz_weights(path, {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.zeros((), np.int64)})
    arrays, _, checked = read_container(path)
    assert checked and arrays["model/a"].tolist() == [[0, 1, 2], [3, 4, 5]]


class _Reduce:
    """Pickles as `func(*args)`."""

    def __init__(self, func, args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


HOSTILE = {
    "reconstruct": _Reduce(np.core.multiarray._reconstruct, (np.ndarray, (HUGE,), b"b")),
    "ndarray": _Reduce(np.ndarray, ((HUGE,), np.dtype("u1"))),
    "bytes": _Reduce(bytes, (HUGE,)),
    "bytearray": _Reduce(bytearray, (HUGE,)),
    "scalar": _Reduce(np.core.multiarray.scalar, (np.dtype("V2147483647"),)),  # the largest item numpy allows
}


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_pickle_allocating_through_an_admitted_global_is_refused(kind, tmp_path):
    path = tmp_path / f"{kind}.pkl"
    path.write_bytes(pickle.dumps({"format": "basebn-checkpoint-v1", "model": {"w": HOSTILE[kind]}}, protocol=4))
    with pytest.raises(CheckpointError, match="more than the file holds"):
        load_legacy_checkpoint(str(path))


def test_pickle_length_field_beyond_the_file_is_refused(tmp_path):
    """BINBYTES8 declaring 1 TiB with 3 bytes behind it: the unpickler would allocate 1 TiB before reading."""
    data = b"\x80\x04" + b"\x8e" + HUGE.to_bytes(8, "little") + b"abc" + b"."
    path = tmp_path / "len.pkl"
    path.write_bytes(data)
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_legacy_checkpoint(str(path))


def test_legitimate_pickles_still_load(tmp_path):
    state = {"w": np.arange(5, dtype=np.float32), "n": np.int64(3), "b": bytearray(b"xy"), "s": np.float32(2.5)}
    path = tmp_path / "ok.pkl"
    path.write_bytes(pickle.dumps({"format": "basebn-checkpoint-v1", "model": state}, protocol=4))
    loaded = load_legacy_checkpoint(str(path))["model"]
    assert loaded["w"].tolist() == [0, 1, 2, 3, 4] and loaded["n"] == 3 and loaded["s"] == 2.5
    assert loaded["b"] == bytearray(b"xy")


def test_cli_reports_a_hostile_weights_file_in_one_line(tmp_path):
    (tmp_path / "tiny.py").write_text(TINY)
    npz = str(tmp_path / "bomb.npz")
    _npz_with_member(npz, "model/w.npy", {"descr": "<f4", "fortran_order": False, "shape": (HUGE,)}, b"")
    pkl = tmp_path / "bomb.pkl"
    pkl.write_bytes(pickle.dumps({"format": "basebn-checkpoint-v1", "model": {"w": HOSTILE["reconstruct"]}}))
    for path in (npz, str(pkl)):
        r = subprocess.run([sys.executable, "-m", "basebn.test", str(tmp_path / "tiny.py"), "-w", path], cwd=ROOT,
                           env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True, timeout=300)
        assert r.returncode == 2, r.stderr[-2000:]
        assert "MemoryError" not in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
        assert [line for line in r.stderr.splitlines() if line.startswith("error:")][0].count(path) == 1
