"""A weights or checkpoint .npz is checked against the model it is loaded into from its .npy headers: a member
whose declared shape, dtype or name cannot fit (a gigabyte of zeros compressing to a megabyte) is refused in one
line before any array is read."""
import os
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest

import basebn.checkpoint.format as container
from basebn.checkpoint import CheckpointError, model_state, read_recorded_config, save_checkpoint, save_npz_weights
from basebn.models import build_model, load_weights
from tests.support import ROOT
from tests.support.cli import TINY

BIG = 1 << 28  # float32 elements: a 1 GiB array
_CHUNK = 1 << 20


def _raw_deflate(data):
    """`data` as deflate blocks ending in a full flush: no back-reference leaves them, so they can be spliced."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    return c.compress(data) + c.flush(zlib.Z_FULL_FLUSH)


def _member(array=None, shape=None, dtype="<f4"):
    """(uncompressed bytes before the zeros, number of zeros) of a .npy member: `array` itself, or a header
    declaring `shape` followed by that many zero bytes (a valid array of zeros, never built in memory)."""
    header = {"descr": dtype if array is None else np.lib.format.dtype_to_descr(array.dtype),
              "fortran_order": False, "shape": tuple(shape if array is None else array.shape)}
    buf = _Bytes()
    np.lib.format.write_array_header_1_0(buf, header)
    if array is not None:
        return buf.data + np.ascontiguousarray(array).tobytes(), 0
    return buf.data, int(np.prod(shape)) * np.dtype(dtype).itemsize


class _Bytes:
    data = b""

    def write(self, b):
        self.data += b


def _write_zip(path, members):
    """A zip of deflated members {name: (prefix bytes, zero count)}, written by hand: its zero runs cost one
    compressed chunk each, so a gigabyte member is a megabyte on disk and takes well under a second to make."""
    zero_block, zeros = _raw_deflate(b"\0" * _CHUNK), b"\0" * _CHUNK
    local, central = b"", b""
    for name, (prefix, count) in members.items():
        crc, body = zlib.crc32(prefix), [_raw_deflate(prefix)]
        whole, rest = divmod(count, _CHUNK)
        for _ in range(whole):
            crc = zlib.crc32(zeros, crc)
        crc = zlib.crc32(zeros[:rest], crc)
        body += [zero_block] * whole + ([_raw_deflate(b"\0" * rest)] if rest else [])
        data = b"".join(body) + zlib.compressobj(9, zlib.DEFLATED, -15).flush()  # the final (empty) block
        size, fname = len(prefix) + count, name.encode()
        assert size < 1 << 32  # no zip64 records written here
        offset = len(local)
        local += struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 8, 0, 0x21, crc, len(data), size, len(fname), 0)
        local += fname + data
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, 8, 0, 0x21, crc, len(data), size,
                               len(fname), 0, 0, 0, 0, 0, offset) + fname
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(members), len(members), len(central), len(local), 0)
    with open(path, "wb") as f:
        f.write(local + central + end)


def _tiny_model(num_classes=10):
    return build_model("resnet20", num_classes=num_classes, in_channels=1, base_width=4)


def _state_members(model, skip=()):
    return {f"model/{k}.npy": _member(v) for k, v in model_state(model).items() if k not in skip}


@pytest.fixture
def no_array_read(monkeypatch):
    """np.load fails: a refusal that comes before any array is read passes, one that comes after does not. The
    memory budget is raised so the zip's total size (checked before, and tested elsewhere) does not decide."""
    def fail(*args, **kwargs):
        raise AssertionError("an array was read before the file was refused")

    monkeypatch.setattr(np, "load", fail)
    monkeypatch.setattr(container, "memory_budget_bytes", lambda: 1 << 40)


def test_handmade_zip_is_a_valid_npz_of_zeros(tmp_path):
    """The hand-made zip is what it claims: np.load gives the declared array (small here, to read it)."""
    path = str(tmp_path / "z.npz")
    _write_zip(path, {"a.npy": _member(shape=(3 * _CHUNK // 4 + 5,)), "b.npy": _member(np.arange(6.0))})
    with np.load(path) as z:
        a, b = z["a"], z["b"]
    assert a.shape == (3 * _CHUNK // 4 + 5,) and a.dtype == np.float32 and not a.any()
    assert b.tolist() == [0, 1, 2, 3, 4, 5]


def test_a_gigabyte_member_that_does_not_fit_is_refused_unread(tmp_path, no_array_read):
    model = _tiny_model()
    members = _state_members(model, skip=("conv1.weight",))
    members["model/conv1.weight.npy"] = _member(shape=(BIG,))
    path = str(tmp_path / "zeros.npz")
    _write_zip(path, members)
    assert os.path.getsize(path) < 4 << 20
    with pytest.raises(CheckpointError) as info:
        load_weights(model, path)
    own = tuple(model.conv1.weight.shape)
    message = str(info.value)
    assert "\n" not in message and "does not fit this model" in message
    assert f"model/conv1.weight is ({BIG},) float32 in the file, {own} float32 in the model" in message


def test_a_dtype_that_does_not_fit_is_refused_unread(tmp_path, no_array_read):
    model = _tiny_model()
    members = _state_members(model)
    members["model/fc.bias.npy"] = _member(np.zeros(10, np.float64))
    path = str(tmp_path / "f64.npz")
    _write_zip(path, members)
    with pytest.raises(CheckpointError, match=r"model/fc.bias is \(10,\) float64 in the file, \(10,\) float32"):
        load_weights(model, path)


def test_names_the_model_lacks_and_a_huge_other_entry_are_refused_unread(tmp_path, no_array_read):
    """Entries outside model/ and ema/ (optimizer state, metadata) may declare at most the model's size."""
    model = _tiny_model()
    members = _state_members(model)
    members["ema/nonexistent.weight.npy"] = _member(np.zeros(3, np.float32))
    members["state/0.npy"] = _member(shape=(BIG,))
    path = str(tmp_path / "extra.npz")
    _write_zip(path, members)
    with pytest.raises(CheckpointError) as info:
        load_weights(model, path)
    assert "ema/nonexistent.weight is not in the model" in str(info.value)
    assert f"state/0 declares {4 * BIG} bytes, more than this model's" in str(info.value)


def test_files_that_fit_still_load(tmp_path):
    """A training checkpoint (optimizer state, EMA) and a classifier of another size with allow_new_head load;
    the same classifier without it is refused, naming it."""
    source = _tiny_model()
    state = model_state(source)
    momentum = {str(i): np.ones_like(v) for i, v in enumerate(state.values())}
    ckpt = str(tmp_path / "latest.npz")
    save_checkpoint(ckpt, {"model": state, "ema": {"module": state, "updates": 3}, "optimizer": momentum,
                           "epoch": 1})
    target = _tiny_model()
    load_weights(target, ckpt)
    assert np.array_equal(np.asarray(target.conv1.weight), state["conv1.weight"])
    other = str(tmp_path / "seven.npz")
    save_npz_weights(other, model_state(_tiny_model(num_classes=7)))
    load_weights(target, other, allow_new_head=True)
    assert tuple(target.fc.weight.shape) == (10, state["fc.weight"].shape[1])
    with pytest.raises(CheckpointError, match=r"model/fc.weight is \(7, "):
        load_weights(target, other)


_PEAK_RSS = """
import resource, subprocess, sys
r = subprocess.run(sys.argv[1:], capture_output=True, text=True)
sys.stderr.write(r.stderr)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)  # Linux: KiB
sys.exit(r.returncode)
"""


def test_cli_refuses_it_in_one_line_without_the_memory(tmp_path):
    """basebn.test -w FILE: exit 2, one line, and the process never holds the gigabyte (peak RSS below it)."""
    (tmp_path / "tiny.py").write_text(TINY)
    model = build_model("resnet20", num_classes=10, in_channels=3, base_width=4)  # TINY's model
    members = _state_members(model, skip=("conv1.weight",))
    members["model/conv1.weight.npy"] = _member(shape=(BIG,))
    path = str(tmp_path / "zeros.npz")
    _write_zip(path, members)
    r = subprocess.run([sys.executable, "-c", _PEAK_RSS, sys.executable, "-m", "basebn.test",
                        str(tmp_path / "tiny.py"), "-w", path], cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr[-2000:]
    assert int(r.stdout.split()[-1]) < 4 * BIG  # peak RSS in bytes, MegEngine included
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "model/conv1.weight is (268435456,) float32 in the file" in errors[0], r.stderr
    assert not r.stderr.split(errors[0])[1].strip(), r.stderr  # nothing after the error line


def test_the_recorded_config_is_read_without_the_arrays(tmp_path, no_array_read):
    """What basebn.test compares the config with comes from the metadata alone."""
    path = str(tmp_path / "latest.npz")
    save_checkpoint(path, {"model": {"w": np.zeros(3, np.float32)}, "config": {"data": {"mean": (0.5, 0.25)}}})
    assert read_recorded_config(path) == {"data": {"mean": (0.5, 0.25)}}
