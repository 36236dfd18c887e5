"""The shell commands of a documentation page, and how tests/test_docs_commands.py runs them as written.

Reading a page. Every ```bash / ```sh / ```console block holds commands: one per line, a line ending in a
backslash continues on the next, `#` starts a comment; in a console block only the lines after a `$ ` prompt are
commands (the rest is output). A command's id is `PAGE:LINE` (its first line in the page).

Markers: HTML comments (invisible on the rendered page) on the lines right above a block's opening fence:
  <!-- docs-test: skip, REASON -->              every command of the block is skipped, with REASON
  <!-- docs-test: skip "TEXT", REASON -->       the block's commands that contain TEXT are skipped, with REASON
  <!-- docs-test: first, COMMAND -->            COMMAND runs before the block (what the block expects to exist,
                                                e.g. a trained run directory); a case of its own
A block without a marker runs in full; so does a command no marker names.

Skipped whatever the page says (SKIP_ALWAYS): `make test*` (the suite itself), `make quickstart` (the full-size
quickstart; its two commands run here as README/training commands do), other `make` goals, package installs
(pip, apt-get: the suite does not change its own environment) and `tensorboard` (a server that runs until stopped).

Running. A page's commands run in order in one working directory of their own, holding links `.venv` (the venv of
the interpreter running the tests) and to the checkout's top-level entries but `runs/` and the packages (configs/,
zoo/, scripts/, ...), so `.venv/bin/python -m ...`, `.venv/bin/mpiexec ...` and `configs/X.py` work as written,
and what a command writes (`runs/...`, `r20.onnx`) is there for the commands after it and nowhere else. The
substitutions, which change what a command costs but not what it does:
  - `basebn.train` gets TRAIN_OVERRIDES (one epoch, the first 256 training and 64 test images) appended, and
    `--restart` unless it has `--resume`/`--restart`: a page lists alternatives for one run directory, and the
    second would be refused by design (training.md: "a previous run is never overwritten"; tested elsewhere);
  - `basebn.test`, `basebn.deploy` (but `--info FILE`, which reads only the file), `basebn.tools.recalibrate` get
    EVAL_OVERRIDES (the first 64 test images);
    `basebn.tools.plot --bn-stats` and `basebn.tools.bn_report` get 64 samples for their statistics pass;
  - a command that names a Fashion-MNIST config, zoo entry or run (`fmnist` in a word) gets `data.root=` a
    stand-in (random 28x28 images in Fashion-MNIST's IDX files) when the dataset is not installed: its flags,
    configs, zoo weights and exports run as written; accuracies are then not those of the page.
The same words with `python -m` under `.venv/bin/mpiexec -n N` get the same substitutions. Every command runs with
the checkout on PYTHONPATH and BASEBN_ONEDNN_ROOT at the venv's real path (unless set): the kernel library's build key
holds oneDNN's path, so the `.venv` link would otherwise make each page build and cache a library of its own.
"""
import dataclasses
import os
import re
import shlex
from typing import List, Optional

import numpy as np

from basebn.data.idx import FASHION_MNIST_DEFAULT_ROOT, write_idx

from . import ROOT

SHELL_FENCE = re.compile(r"^```(bash|sh|console)\s*$")
MARKER = re.compile(r"^<!--\s*docs-test:\s*(.*?)\s*-->\s*$")
MARKER_SKIP = re.compile(r'^skip(?:\s+"([^"]+)")?\s*,\s*(\S.*)$')
MARKER_FIRST = re.compile(r"^first\s*,\s*(\S.*)$")

TRAIN_OVERRIDES = ("solver.max_epoch=1", "data.max_train_samples=256", "data.max_test_samples=64")
EVAL_OVERRIDES = ("data.max_test_samples=64",)
STATISTICS_SAMPLES = "64"
EVAL_MODULES = ("basebn.test", "basebn.deploy", "basebn.tools.recalibrate")
# not linked into a page's working directory: what commands write (runs/), git, the venv, and the packages
# (basebn is imported from the checkout through PYTHONPATH, so its own paths, e.g. the zoo's root, stay the checkout's)
NOT_LINKED = (".git", ".venv", "runs", "site", "build", "basebn", "tests")

SKIP_ALWAYS = (
    (re.compile(r"^make test"), "the test suite itself"),
    (re.compile(r"^make quickstart\b"), "the full-size quickstart (minutes); its basebn.train and basebn.test "
                                        "commands run here as the pages' own commands"),
    (re.compile(r"^make\b"), "a make goal (setup, benchmarks, docs site): not a command of basebn's"),
    (re.compile(r"^(\S*/)?pip3? install\b|^apt(-get)? install\b"), "installs packages: the suite does not change "
                                                                  "its own environment"),
    (re.compile(r"^(\S*/)?tensorboard\b"), "starts a server that runs until it is stopped"),
)


class MarkerError(ValueError):
    """A `docs-test:` marker the reader does not understand (a typo would otherwise run or skip silently)."""


@dataclasses.dataclass
class Command:
    page: str  # path relative to the repository root
    line: int  # 1-based line of the command's first line in the page
    text: str  # the command as one line, comments and continuations removed
    skip: Optional[str] = None  # why it does not run; None: it runs

    @property
    def id(self):
        return f"{self.page}:{self.line}"


def _markers_above(lines, fence_index):
    """The `docs-test:` marker texts on the lines right above line `fence_index` (blank lines may separate)."""
    found, i = [], fence_index - 1
    while i >= 0 and (not lines[i].strip() or MARKER.match(lines[i].strip())):
        m = MARKER.match(lines[i].strip())
        if m:
            found.insert(0, (i + 1, m.group(1)))
        i -= 1
    return found


def _block_commands(lines, start, kind):
    """(line number, command text) of the block whose first content line is lines[start]; and the closing index."""
    commands, pending, first_line, i = [], "", None, start
    while i < len(lines) and lines[i].strip() != "```":
        raw = lines[i].rstrip("\n")
        if kind == "console" and not pending:
            raw = raw[2:] if raw.startswith("$ ") else ""
        text = _strip_comment(raw).rstrip()
        if text.strip() or pending:
            first_line = first_line or i + 1
            if text.endswith("\\"):
                pending += text[:-1] + " "
            else:
                commands.append((first_line, " ".join((pending + text).split())))
                pending, first_line = "", None
        i += 1
    return commands, i


def _strip_comment(line):
    """`line` without a shell comment: a `#` at the start or after a blank, outside quotes."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def page_commands(path) -> List[Command]:
    """Every command of the shell blocks of the page at `path`, in page order, with its skip reason."""
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    page = os.path.relpath(path, ROOT)
    out, i = [], 0
    while i < len(lines):
        m = SHELL_FENCE.match(lines[i].strip())
        if not m:
            i += 1
            continue
        skips, firsts = [], []
        for number, marker in _markers_above(lines, i):
            skip, first = MARKER_SKIP.match(marker), MARKER_FIRST.match(marker)
            if skip:
                skips.append((skip.group(1), skip.group(2)))
            elif first:
                firsts.append(Command(page, number, first.group(1)))
            else:
                raise MarkerError(f"{page}:{number}: unknown docs-test marker {marker!r} "
                                  "(skip, REASON | skip \"TEXT\", REASON | first, COMMAND)")
        commands, i = _block_commands(lines, i + 1, m.group(1))
        out += firsts
        for number, text in commands:
            reason = next((r for text_part, r in skips if text_part is None or text_part in text), None)
            out.append(Command(page, number, text, reason or always_skipped(text)))
        i += 1
    return out


def always_skipped(text):
    return next((reason for pattern, reason in SKIP_ALWAYS if pattern.search(text)), None)


def fashion_mnist_installed():
    return os.path.isdir(FASHION_MNIST_DEFAULT_ROOT)


def write_fashion_mnist_standin(root, n_train=256, n_test=64):
    """Fashion-MNIST's four IDX files at `root`, holding random 28x28 images and labels 0..9; returns `root`."""
    rng = np.random.default_rng(0)
    os.makedirs(root, exist_ok=True)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        write_idx(os.path.join(root, f"{prefix}-images-idx3-ubyte.gz"), rng.integers(0, 256, (n, 28, 28), np.uint8))
        write_idx(os.path.join(root, f"{prefix}-labels-idx1-ubyte.gz"), np.arange(n, dtype=np.uint8) % 10)
    return root


def make_workdir(folder, venv):
    """Link `.venv` (to `venv`) and the checkout's top-level files and folders (but NOT_LINKED) into `folder`;
    returns `folder`."""
    os.makedirs(folder, exist_ok=True)
    os.symlink(venv, os.path.join(folder, ".venv"))
    for name in sorted(os.listdir(ROOT)):
        if name not in NOT_LINKED and not name.endswith(".egg-info"):
            os.symlink(os.path.join(ROOT, name), os.path.join(folder, name))
    return folder


def python_module(words):
    """(index of the word after `-m MODULE`, MODULE) of a `python -m MODULE ...` command, else (None, None)."""
    for i in range(1, len(words) - 1):
        if words[i] == "-m" and os.path.basename(words[i - 1]).startswith("python"):
            return i + 2, words[i + 1]
    return None, None


def is_mpi(words):
    return bool(words) and os.path.basename(words[0]) in ("mpiexec", "mpirun")


def substitute(text, standin_root=None):
    """The argument list that runs command `text` at the test's cost (the module docstring's rules)."""
    words = shlex.split(text)
    _, module = python_module(words)
    extra = []
    if module == "basebn.train":
        extra += TRAIN_OVERRIDES
        if not {"--resume", "--restart"} & set(words):
            extra.append("--restart")
    elif module in EVAL_MODULES and "--info" not in words:
        extra += EVAL_OVERRIDES
    elif module == "basebn.tools.plot" and "--bn-stats" in words:
        extra += ["--num-samples", STATISTICS_SAMPLES]
    elif module == "basebn.tools.bn_report" and "--data-samples" not in words:
        extra += ["--data-samples", STATISTICS_SAMPLES]
    elif module == "basebn.tools.bn_report":
        words[words.index("--data-samples") + 1] = STATISTICS_SAMPLES
    takes_overrides = module in ("basebn.train",) + EVAL_MODULES and "--info" not in words
    if takes_overrides and standin_root and any("fmnist" in w for w in words):
        extra.append(f"data.root={standin_root}")
    return words + list(extra)


def expected_outputs(words):
    """What the command promises besides exit 0: (prints a last JSON line, [files or folders it writes])."""
    paths = [words[i + 1] for i, w in enumerate(words[:-1]) if w in ("-o", "--output", "--out", "--save-adapted")]
    return "--json" in words, paths
