"""The pages' shell commands run as written: every command of every ```bash/sh/console block of README.md and the
user pages below exits 0, in page order, in a working directory of its page's own (tests/support/doc_commands.py
says how a page is read, which markers skip what and why, and the substitutions that keep each command cheap
without changing what it does). A command that says it prints JSON (`--json`) prints a JSON object last; one that
names a file or folder to write (`-o`, `--out`, `--save-adapted`) leaves it there. `mpiexec` commands carry the
suite's `mpi` marker."""
import json
import os
import shlex
import signal
import subprocess
import sys

import pytest

from tests.support import ROOT
from tests.support.doc_commands import (MarkerError, expected_outputs, fashion_mnist_installed, is_mpi,
                                        make_workdir, page_commands, substitute, write_fashion_mnist_standin)

PAGES = ("README.md", "docs/training.md", "docs/library.md", "docs/multi_process.md", "docs/bn_after_training.md",
         "docs/deploy.md")
OPTIONAL_PAGES = ("docs/library.md",)
COMMAND_TIMEOUT_S = 600
# the kernel library's build key holds oneDNN's path, found under sys.prefix: through the working directory's `.venv`
# link every page would build (about a minute) and cache a library of its own; the real path reuses the suite's
KERNEL_ONEDNN_ROOT = "BASEBN_ONEDNN_ROOT"


def _commands():
    found = []
    for page in PAGES:
        path = os.path.join(ROOT, page)
        if os.path.exists(path) or page not in OPTIONAL_PAGES:
            found += page_commands(path)
    return found


def _is_mpi(command):
    try:
        return is_mpi(shlex.split(command.text))
    except ValueError:  # unbalanced quotes: the case itself fails with shlex's message
        return False


def _param(command):
    return pytest.param(command, id=command.id, marks=[pytest.mark.mpi] if _is_mpi(command) else [])


COMMANDS = _commands()


def _env(venv):
    """The suite's environment, with the checkout on PYTHONPATH and oneDNN found at the venv's real path."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.setdefault(KERNEL_ONEDNN_ROOT, os.path.realpath(venv))
    for var in list(env):  # an enclosing MPI job's variables would confuse a nested mpiexec
        if var.startswith(("PMI_", "PMIX_", "OMPI_", "MPI_LOCAL", "HYDRA_")):
            del env[var]
    return env


class PageRuns:
    """Each page's working directory and the results of its commands; a command runs after its page's earlier
    commands (run first when a selection left them out: a page's commands build on each other), but for `mpiexec`
    ones, which `-m "not mpi"` leaves out on purpose (no page's single-process command needs an MPI run's output)."""

    def __init__(self, base):
        self.base, self.workdirs, self.results = base, {}, {}
        self.standin = None if fashion_mnist_installed() else write_fashion_mnist_standin(str(base / "fmnist"))

    def run(self, command):
        page_commands_ = [c for c in COMMANDS if c.page == command.page]
        for earlier in page_commands_[:page_commands_.index(command)]:
            if earlier.skip is None and earlier.id not in self.results and not _is_mpi(earlier):
                self._run(earlier)
        return self._run(command)

    def _run(self, command):
        page, venv = command.page, os.path.dirname(os.path.dirname(sys.executable))
        if page not in self.workdirs:
            self.workdirs[page] = make_workdir(str(self.base / page.replace("/", "_")), venv)
        words = substitute(command.text, self.standin)
        proc = subprocess.Popen(words, cwd=self.workdirs[page], env=_env(venv), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=COMMAND_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            err += f"\n(killed after {COMMAND_TIMEOUT_S} s)"
        self.results[command.id] = result = (words, proc.returncode, out, err)
        return result


@pytest.fixture(scope="module")
def page_runs(tmp_path_factory):
    return PageRuns(tmp_path_factory.mktemp("doc_pages"))


@pytest.mark.parametrize("command", [_param(c) for c in COMMANDS])
def test_doc_command_runs_as_written(command, page_runs):
    if command.skip:
        pytest.skip(command.skip)
    words, code, out, err = page_runs.run(command)
    shown = f"{command.id}: {command.text}\nran: {shlex.join(words)}"
    assert code == 0, f"{shown}\nexit {code}\n{out[-2000:]}\n{err[-4000:]}"
    prints_json, paths = expected_outputs(words)
    if prints_json:
        last = out.strip().splitlines()[-1] if out.strip() else ""
        assert isinstance(json.loads(last), dict), f"{shown}\nlast line is not a JSON object: {last!r}"
    for path in paths:
        assert os.path.exists(os.path.join(page_runs.workdirs[command.page], path)), f"{shown}\nno {path} written"


def test_every_page_has_commands_and_every_skip_says_why():
    pages = {c.page for c in COMMANDS}
    assert {p for p in PAGES if p not in OPTIONAL_PAGES} <= pages, pages
    assert all(c.skip is None or c.skip.strip() for c in COMMANDS)


PAGE = """# A page
<!-- docs-test: first, .venv/bin/python -m basebn.train configs/quickstart.py -->

```bash
.venv/bin/python -m basebn.test configs/quickstart.py -w runs/quickstart \\
    --json   # a comment
# a whole-line comment

make test
```
Prose with ```inline``` fences is not a block.
<!-- docs-test: skip "imagenet", needs ImageNet at data.root -->
```sh
.venv/bin/mpiexec -n 2 .venv/bin/python -m basebn.train configs/fmnist_resnet20.py model.norm=SyncBN
.venv/bin/python -m basebn.test configs/imagenet_basecls_eval.py data.root=/x
```
```console
$ .venv/bin/python -m basebn.deploy r.onnx --info '#not a comment'
input data (N, 1, 28, 28)
```
```python
print("not a shell block")
```
<!-- docs-test: skip, placeholders -->
```bash
python -m basebn.test CONFIG.py -w RUN_DIR
```
"""


def test_the_reader_finds_commands_markers_and_skips(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(PAGE)
    got = [(c.line, c.text, c.skip) for c in page_commands(str(page))]
    assert [(line, text) for line, text, _ in got] == [
        (2, ".venv/bin/python -m basebn.train configs/quickstart.py"),
        (5, ".venv/bin/python -m basebn.test configs/quickstart.py -w runs/quickstart --json"),
        (9, "make test"),
        (14, ".venv/bin/mpiexec -n 2 .venv/bin/python -m basebn.train configs/fmnist_resnet20.py model.norm=SyncBN"),
        (15, ".venv/bin/python -m basebn.test configs/imagenet_basecls_eval.py data.root=/x"),
        (18, ".venv/bin/python -m basebn.deploy r.onnx --info '#not a comment'"),
        (26, "python -m basebn.test CONFIG.py -w RUN_DIR"),
    ]
    skips = [skip for _, _, skip in got]
    assert skips[:2] == [None, None] and skips[2] == "the test suite itself"
    assert skips[3:6] == [None, "needs ImageNet at data.root", None] and skips[6] == "placeholders"


def test_an_unknown_marker_is_an_error(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("<!-- docs-test: skp, typo -->\n```bash\nls\n```\n")
    with pytest.raises(MarkerError, match="page.md:1: unknown docs-test marker 'skp, typo'"):
        page_commands(str(page))


def test_the_substitutions_shrink_the_cost_and_keep_the_words():
    train = substitute(".venv/bin/mpiexec -n 2 .venv/bin/python -m basebn.train configs/fmnist_resnet20.py "
                       "model.norm=SyncBN", standin_root="/s")
    assert train == [".venv/bin/mpiexec", "-n", "2", ".venv/bin/python", "-m", "basebn.train",
                     "configs/fmnist_resnet20.py", "model.norm=SyncBN", "solver.max_epoch=1",
                     "data.max_train_samples=256", "data.max_test_samples=64", "--restart", "data.root=/s"]
    assert substitute(".venv/bin/python -m basebn.train runs/q --resume")[-1] == "data.max_test_samples=64"
    assert substitute(".venv/bin/python -m basebn.test runs/q --json", standin_root="/s") == [
        ".venv/bin/python", "-m", "basebn.test", "runs/q", "--json", "data.max_test_samples=64"]
    assert substitute(".venv/bin/python -m basebn.tools.plot runs/a") == [".venv/bin/python", "-m",
                                                                           "basebn.tools.plot", "runs/a"]
    assert expected_outputs(["x", "-o", "r.onnx", "--json"]) == (True, ["r.onnx"])
