"""The committed pages agree with the results files: the README's headline table and docs/figures.md's tables are
what scripts/make_figures.py generates from results/*.json (generated to strings and compared; nothing written).
Also: every results file records where and when each run was measured, the shared writer of
benchmarks/results_file.py appends runs without losing earlier ones, and every timing script takes its --results."""
import argparse
import copy
import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

from benchmarks import results_file
from tests.support import ROOT

_spec = importlib.util.spec_from_file_location("make_figures", os.path.join(ROOT, "scripts", "make_figures.py"))
make_figures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_figures)

RESULTS = os.path.join(ROOT, "results")


@pytest.fixture(scope="module")
def results():
    return make_figures.load_results(RESULTS)


def test_committed_pages_equal_what_the_results_files_generate(results):
    stale = [page for page, (old, new) in make_figures.pages(results, ROOT).items() if old != new]
    assert not stale, f"{stale} disagree with results/*.json: run `make figures` (or fix the results file)"


def test_a_changed_figure_changes_the_page(results):
    """The comparison above would catch a results file edited without regenerating: change one headline figure
    (the EMA's share of a step, 0.28%) and the generated README no longer equals the committed one."""
    changed = copy.deepcopy(results)
    for run in changed["ema.json"]["runs"]:
        if run["kind"] == "ema":
            run["figures"]["share_of_step"]["flat"] = 0.0031
    old, new = make_figures.pages(changed, ROOT)["README.md"]
    assert "| 0.31% |" in new and "| 0.31% |" not in old


def test_a_changed_adaptation_cell_changes_the_guide(results):
    """The experiment tables are compared too: change one Fashion-MNIST-C cell of results/fmnist_c.json (TENT's
    error on Gaussian noise, severity 5, batch 200) and the generated docs/bn_after_training.md shows it."""
    changed = copy.deepcopy(results)
    run = [r for r in changed["fmnist_c.json"]["runs"] if r["kind"] == "table"][-1]
    run["figures"]["models"]["zoo:fmnist_r20_fullres_restart2"]["severity 5"]["batch 200"]["tent"][
        "gaussian_noise"] = 99.94
    old, new = make_figures.pages(changed, ROOT)["docs/bn_after_training.md"]

    def gauss_cell(page):  # | severity | batch | --adapt | mean | clean | gauss | ...
        return next(line for line in page.splitlines() if line.startswith("| 5 | 200 | tent |")).split(" | ")[5]
    assert gauss_cell(new) == "99.9" != gauss_cell(old)


def test_every_row_links_its_results_file_and_the_readme_has_at_most_ten():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    block = readme.split(make_figures.START)[1].split(make_figures.END)[0]
    rows = [line for line in block.splitlines() if line.startswith("| ") and not line.startswith("| figure ")]
    assert 1 <= len(rows) <= 10
    for line in rows:
        target = re.search(r"\]\((results/[\w.]+\.json)\) \|$", line)
        assert target and os.path.isfile(os.path.join(ROOT, target.group(1))), line


@pytest.mark.parametrize("name", sorted(n for n in os.listdir(RESULTS) if n.endswith(".json")))
def test_each_run_records_host_threads_versions_commit_and_date(name):
    with open(os.path.join(RESULTS, name), encoding="utf-8") as f:
        data = json.load(f)
    assert data["rows"], f"{name}: no rows to show"
    ids = [run["id"] for run in data["runs"]]
    assert len(ids) == len(set(ids)), f"{name}: run ids repeat"
    for run in data["runs"]:
        where = f"{name} run {run['id']}"
        assert {"name", "cpu_model", "flags", "cores"} <= set(run["host"]), where
        assert isinstance(run["threads"], list), where
        assert run["versions"].get("megengine"), where
        assert re.fullmatch(r"20\d\d-\d\d-\d\d( \d\d:\d\d)?", run["date"]), where
        # a run records its commit, or (transcribed from the docs) the commit that first recorded its figures
        assert run.get("commit") or re.fullmatch(r"[0-9a-f]{12}", run.get("recorded_in", "")), where


def test_a_row_shows_the_latest_run_of_its_kind_that_has_the_figure():
    data = {"section": "Experiments", "runs": [
        {"id": "a", "kind": "k", "host": {"name": "host A"}, "figures": {"x": 1.5, "r": {"min": 0.5, "max": 0.9}}},
        {"id": "b", "kind": "k", "host": {"name": "host B"}, "figures": {"x": 1.25}},
        {"id": "c", "kind": "other", "host": {"name": "host C"}, "figures": {"x": 9.0}}]}
    text, run = make_figures.cell("t.json", data, {"figure": "f", "kind": "k", "value": ["x"], "format": "{v:.2f}×"})
    assert (text, run["id"]) == ("1.25×", "b")
    text, run = make_figures.cell("t.json", data, {"figure": "f", "kind": "k", "range": [["r"], ["x"]],
                                                   "format": "{min:.2f}–{max:.2f}"})
    assert (text, run["id"]) == ("0.50–1.50", "a")  # only run a has r
    with pytest.raises(make_figures.FiguresError, match="no run has the figure"):
        make_figures.cell("t.json", data, {"figure": "f", "kind": "k", "value": ["y"], "format": "{v}"})


def test_the_markers_must_be_there_once():
    assert make_figures.replace_block("a\n<!-- figures:start -->\nold\n<!-- figures:end -->\nb", "new", "p") == \
        "a\n<!-- figures:start -->\nnew\n<!-- figures:end -->\nb"
    with pytest.raises(make_figures.FiguresError, match="needs one"):
        make_figures.replace_block("no markers", "new", "p")


def test_results_writer_appends_runs_and_keeps_the_earlier_ones(tmp_path):
    path = str(tmp_path / "x.json")
    first = results_file.run_record("k", "bench --a", [1, 2], {"v": 1.0}, torch_version="2.0")
    results_file.append_run(path, first, "benchmarks/bench_x.py", "what x measures")
    second = results_file.run_record("k", "bench --b", [2], {"v": 2.0})
    data = results_file.append_run(path, second, "ignored", "ignored")
    with open(path, encoding="utf-8") as f:
        assert json.load(f) == data
    assert [r["command"] for r in data["runs"]] == ["bench --a", "bench --b"]
    assert data["benchmark"] == "benchmarks/bench_x.py" and data["rows"] == []
    assert first["versions"]["torch"] == "2.0" and "torch" not in second["versions"]
    assert set(first["host"]) == {"name", "cpu_model", "flags", "cores"} and first["threads"] == [1, 2]
    assert re.fullmatch(r"20\d\d-\d\d-\d\d \d\d:\d\d", first["date"])


def test_results_option_refuses_a_folder_or_a_file_that_is_not_a_results_file(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    results_file.add_results_argument(parser)
    (tmp_path / "notes.json").write_text("[1, 2]")
    for bad, says in ((str(tmp_path), "is a folder"), (str(tmp_path / "notes.json"), "no 'runs' list"),
                      (str(tmp_path / "missing" / "x.json"), "folder does not exist")):
        with pytest.raises(SystemExit) as e:
            parser.parse_args(["--results", bad])
        assert e.value.code == 2 and says in capsys.readouterr().err
    assert parser.parse_args(["--results", str(tmp_path / "new.json")]).results == str(tmp_path / "new.json")


def test_host_info_reads_the_cpu_model_and_vector_flags(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: AMD EPYC 9B45\nflags\t\t: fpu sse2 avx2 fma avx512f ht\n")
    host = results_file.host_info(str(cpuinfo))
    assert host["cpu_model"] == "AMD EPYC 9B45"
    assert host["flags"] == ["sse2", "fma", "avx2", "avx512f"]
    assert "AVX-512" in host["name"]


@pytest.fixture(scope="module")
def bench_train_step():
    """benchmarks/bench_train_step.py as a module (it imports its sibling results_file as a script does)."""
    folder = os.path.join(ROOT, "benchmarks")
    sys.path.insert(0, folder)
    try:
        spec = importlib.util.spec_from_file_location("bench_train_step", os.path.join(folder, "bench_train_step.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(folder)
    return module


def test_a_new_training_step_run_becomes_the_pages_figure(bench_train_step, results):
    """What bench_train_step.py --results appends is what train_step.json's rows read: from hand-made step times
    (ResNet-20 medians 300 / 500 ms at 1 thread, 150 / 300 ms at 2), the page shows the new run's ratios."""
    raw = [{"model": "resnet20", "threads": 1, "times": {"basebn": [0.2, 0.4, 0.3], "torch": [0.5, 0.4, 0.6]}},
           {"model": "resnet20", "threads": 2, "times": {"basebn": [0.15, 0.2, 0.1], "torch": [0.3, 0.25, 0.35]},
            "paired": {"torch": [0.9, 0.8, 1.1]}}]
    figures = bench_train_step.results_figures(raw)
    assert figures["resnet20"]["ms"] == {"1": {"basebn": 300.0, "torch": 500.0}, "2": {"basebn": 150.0, "torch": 300.0}}
    assert figures["resnet20"]["ratio"] == {"1": {"basebn/torch": 0.6}, "2": {"basebn/torch": 0.5}}
    assert figures["resnet20"]["speedup"] == {"basebn": 2.0, "torch": round(500 / 300, 3)}
    data = copy.deepcopy(results["train_step.json"])
    data["runs"].append({"id": "new", "kind": "same-window", "host": {"name": "new host"}, "figures": figures})
    shown = {row["figure"]: make_figures.cell("train_step.json", data, row) for row in data["rows"]
             if row["figure"].startswith("ResNet-20")}
    text, run = shown["ResNet-20, 1 thread: basebn's step / PyTorch eager's"]
    assert (text, run["id"]) == ("0.60×", "new")
    text, run = shown["ResNet-20: 1 → 2-thread speed-up, basebn's / PyTorch's, paired per round (95% interval)"]
    assert (text, run["id"]) == ("0.900 (0.80–1.10)", "new")


TIMING_SCRIPTS = sorted(os.path.join("benchmarks", n) for n in os.listdir(os.path.join(ROOT, "benchmarks"))
                        if n.startswith("bench_") and n.endswith(".py")) + [os.path.join("benchmarks", "cuda",
                                                                                          "run_harness.py")]
# runs each script as __main__ with `--results <a folder>`: results_file's check refuses it while the arguments are
# parsed, before anything is measured; prints {script: [exit code, the end of its stderr]}
_PARSE_ONLY = r'''
import contextlib, io, json, os, runpy, sys
root, folder, scripts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
sys.path[:0] = [root, os.path.join(root, "benchmarks")]
out = {}
for script in scripts:
    sys.argv = [script, "--results", folder]
    err, code = io.StringIO(), None
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            runpy.run_path(os.path.join(root, script), run_name="__main__")
        except SystemExit as e:
            code = e.code
    out[script] = [code, err.getvalue()[-300:]]
print("@@" + json.dumps(out))
'''


@pytest.fixture(scope="module")
def parsed_results_option(tmp_path_factory):
    """What every timing script says to ``--results FOLDER``: one interpreter parses them all (no timing runs)."""
    env = dict(os.environ, BASEBN_TUNE_CPU="0")
    proc = subprocess.run([sys.executable, "-c", _PARSE_ONLY, ROOT, str(tmp_path_factory.mktemp("results")),
                           json.dumps(TIMING_SCRIPTS)], capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("@@")), None)
    assert line, proc.stderr[-2000:]
    return json.loads(line[2:])


@pytest.mark.parametrize("script", TIMING_SCRIPTS)
def test_every_timing_script_takes_the_shared_results_option(parsed_results_option, script):
    """Each timing script has ``--results FILE`` from benchmarks/results_file.py: given a folder, its argument
    parsing stops with results_file's one-line refusal (exit 2), so the option is the shared one."""
    code, err = parsed_results_option[script]
    assert code == 2 and "argument --results" in err and "is a folder" in err, (script, code, err)
