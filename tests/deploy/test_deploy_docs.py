"""docs/deploy.md runs as written: every command block is marked runnable, its bash blocks run (a small training run
first: fewer images, one epoch, a narrower model), and its Python blocks (onnxruntime and Lite, preprocessing by
the file's metadata) give, on a test image, basebn's own evaluation input and the eager model's logits: for the
quickstart export (grey, 16 px) and for an RGB image-folder export (resize 18, center crop 16)."""
import os
import re
import shlex
import shutil
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from basebn.checkpoint import save_npz_weights
from basebn.config import load_config
from basebn.data.idx import FASHION_MNIST_DEFAULT_ROOT
from basebn.data.image_files import decode_image
from basebn.deploy import eager_logits
from basebn.deploy.cli import main as deploy_main
from basebn.engine.build import build_data, build_model_from_cfg, load_trained, resolve_config
from tests.support import ROOT
from tests.support.image_folder import folder_config

from .helpers import randomize_bn, scaled_tolerance

PAGE = os.path.join(ROOT, "docs", "deploy.md")
BLOCK = re.compile(r"^(?:<!-- runnable(?:: (?P<needs>[\w-]+))? -->\n)?```(?P<lang>bash|python)\n(?P<body>.*?)^```$",
                   re.MULTILINE | re.DOTALL)
TINY_TRAIN = ["data.train_size=128", "data.test_size=64", "solver.max_epoch=1", "solver.warmup_epochs=0",
              "model.base_width=4"]
NEEDS = {"fashion-mnist": os.path.isdir(FASHION_MNIST_DEFAULT_ROOT)}
TOLERANCE = 1e-4


def blocks(path=PAGE):
    """(language, marker or None, body) of every ```bash / ```python block; marker: "" for `<!-- runnable -->`,
    else what follows `runnable: `."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    out = []
    for m in BLOCK.finditer(text):
        marked = m.group(0).startswith("<!--")
        out.append((m.group("lang"), (m.group("needs") or "") if marked else None, m.group("body")))
    return out


def test_the_block_reader_sees_markers(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("<!-- runnable -->\n```bash\na\n```\n```bash\nb\n```\n<!-- runnable: fashion-mnist -->\n"
                    "```python\nc\n```\n```text\nd\n```\n")
    assert blocks(str(page)) == [("bash", "", "a\n"), ("bash", None, "b\n"), ("python", "fashion-mnist", "c\n")]


def test_every_command_block_is_marked_runnable():
    unmarked = [body for lang, marker, body in blocks()
                if marker is None and (lang == "python" or "python -m basebn." in body)]
    assert unmarked == [], unmarked
    assert {marker for _, marker, _ in blocks() if marker} <= set(NEEDS)
    assert sum(lang == "python" and marker == "" for lang, marker, _ in blocks()) == 2


def commands(body):
    """The basebn command lines of a bash block, comments dropped, the interpreter this one, tiny training runs."""
    out = []
    for line in body.splitlines():
        line = line.split(" #")[0].strip()
        if not line.startswith(".venv/bin/python -m basebn."):
            continue
        args = shlex.split(line)
        args[0] = sys.executable
        if args[2] == "basebn.train":
            args += TINY_TRAIN
        out.append(args)
    return out


def run_bash_blocks(cwd, needs=""):
    """Run the marked bash blocks needing `needs` in `cwd`; returns {command line: stdout}."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    outputs = {}
    for lang, marker, body in blocks():
        if lang != "bash" or marker != needs:
            continue
        for args in commands(body):
            r = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
            assert r.returncode == 0, (args, r.stderr[-3000:])
            outputs[" ".join(args[2:])] = r.stdout
    assert outputs, f"no bash block needing {needs!r}"
    return outputs


def run_python_blocks(cwd, monkeypatch):
    """Run the page's Python blocks in order, as one script in `cwd`; returns their variables."""
    code = "\n\n".join(body for lang, marker, body in blocks() if lang == "python" and marker == "")
    namespace = {"__name__": "deploy_page"}
    monkeypatch.chdir(cwd)
    exec(compile(code, PAGE, "exec"), namespace)
    return namespace


def check_against_eager(ns, model, reference_x):
    """The page's input equals basebn's evaluation input; its ONNX and Lite logits and class, the eager model's."""
    np.testing.assert_allclose(ns["x"], reference_x, rtol=0, atol=1e-5)
    expected = eager_logits(model, reference_x)
    tol = scaled_tolerance(model, reference_x, TOLERANCE)
    assert np.max(np.abs(ns["logits"] - expected)) <= tol
    assert np.max(np.abs(ns["lite_logits"] - expected)) <= tol
    assert ns["top"] == int(expected[0].argmax())


def test_the_page_runs_on_the_quickstart_export(tmp_path, monkeypatch):
    os.makedirs(tmp_path / "configs")
    shutil.copy(os.path.join(ROOT, "configs", "quickstart.py"), tmp_path / "configs")
    outputs = run_bash_blocks(tmp_path)
    info = next(out for line, out in outputs.items() if "--info" in line)
    assert "expects: GRAY, 16x16, input data (batch, 1, 16, 16) float32 NCHW" in info, info
    run_dir = str(tmp_path / "runs" / "quickstart")
    cfg, weights = resolve_config(run_dir, [], run_dir)
    model, ds, loader = load_trained(cfg, weights)
    Image.fromarray(ds.get_images([0])[0][..., 0], "L").save(tmp_path / "image.png")  # a test image, as PNG
    reference_x = np.asarray(next(iter(loader))[0][:1])  # what basebn.test evaluates for it
    check_against_eager(run_python_blocks(tmp_path, monkeypatch), model, reference_x)


def test_the_python_blocks_on_an_rgb_image_folder_export(tmp_path, monkeypatch):
    cfg_path, _ = folder_config(tmp_path, per_class=2)
    model, _, loader = load_trained(load_config(cfg_path), _folder_weights(cfg_path, tmp_path))
    for fmt in ("onnx", "mge"):
        assert deploy_main([cfg_path, "-w", str(tmp_path / "w.npz"), "--format", fmt,
                            "-o", str(tmp_path / f"model.{fmt}")]) == 0
    rgb = np.random.default_rng(7).integers(0, 256, (18, 23, 3), dtype=np.uint8)  # shorter side 18: no resize
    Image.fromarray(rgb, "RGB").save(tmp_path / "image.png")
    reference = loader.sample_transform(decode_image(str(tmp_path / "image.png"), 3), np.random.default_rng(0))
    check_against_eager(run_python_blocks(tmp_path, monkeypatch), model, reference[None])
    big = np.random.default_rng(8).integers(0, 256, (30, 41, 3), dtype=np.uint8)  # resized, then cropped
    Image.fromarray(big, "RGB").save(tmp_path / "image.png")
    ns = run_python_blocks(tmp_path, monkeypatch)
    assert ns["x"].shape == (1, 3, 16, 16)
    assert np.max(np.abs(ns["logits"] - eager_logits(model, ns["x"]))) <= scaled_tolerance(model, ns["x"], TOLERANCE)


def _folder_weights(cfg_path, folder):
    """A weights file (random BN statistics) for the image-folder config's model."""
    cfg = load_config(cfg_path)
    ds, _ = build_data(cfg, train=False)
    model = randomize_bn(build_model_from_cfg(cfg, in_channels=ds.image_shape[0]))
    path = str(folder / "w.npz")
    save_npz_weights(path, {k: np.asarray(v) for k, v in model.state_dict().items()})
    return path


@pytest.mark.skipif(not NEEDS["fashion-mnist"], reason="Fashion-MNIST not installed")
def test_the_zoo_block_runs(tmp_path):
    run_bash_blocks(tmp_path, needs="fashion-mnist")
