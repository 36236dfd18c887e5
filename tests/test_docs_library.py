"""docs/library.md runs as written: its ```python blocks, in order, as one script in a fresh interpreter (an empty
folder as working directory), end without an error, print no MegEngine CUDA banner, and print what the page says
they compute (ResNet-20 has 21 BN layers: 19 along its convs, 2 on its projection shortcuts)."""
import os
import re
import subprocess
import sys

from tests.support import ROOT

PAGE = os.path.join(ROOT, "docs", "library.md")
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)
_NOISE = ("failed to load cuda func", "MegEngine works under CPU mode")


def python_blocks(path=PAGE):
    with open(path, encoding="utf-8") as f:
        return BLOCK.findall(f.read())


def test_the_block_reader_finds_each_python_block_and_nothing_else():
    text = "# t\n```python\na = 1\n```\n\n```sh\nls\n```\n```python\nb = 2\nc = 3\n```\n"
    assert BLOCK.findall(text) == ["a = 1\n", "b = 2\nc = 3\n"]


def test_the_library_page_runs_as_one_script(tmp_path):
    blocks = python_blocks()
    assert len(blocks) >= 7, len(blocks)  # a training step, BN layers, EMA, precise BN, adaptation, processes, files
    script = tmp_path / "library_page.py"
    script.write_text("\n\n".join(blocks))
    env = {k: v for k, v in os.environ.items() if k != "BASEBN_TUNE_CPU"}
    env["PYTHONPATH"] = ROOT
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    assert [line for line in out.stderr.splitlines() if any(n in line for n in _NOISE)] == [], out.stderr
    lines = out.stdout.splitlines()
    assert re.fullmatch(r"loss \d+\.\d{3}", lines[0]), lines
    assert "21 BN layers from 128 images" in lines
    assert "BN buffers synced: 0 of 1 process(es)" in lines
    assert "recalibrated 21 BN layers from 64 images" in lines
    assert [line.split() for line in lines if line.split()[0] in ("bn_batch_predict", "adabn", "tent")] == [
        [name, "(64,", "10)"] for name in ("bn_batch_predict", "adabn", "tent")]
    assert (tmp_path / "recalibrated.npz").is_file()
