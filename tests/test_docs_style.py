"""README.md and docs/*.md say what holds now: no internal issue letters, no dates (those belong in CHANGELOG.md),
no narration of past runs; and the README stays a front page (at most 120 lines, no table cell over 300
characters). Plain greps over the files' text, so a reader's view of the pages is what is checked."""
import os
import re

import pytest

from tests.support import ROOT

MAX_README_LINES = 120
MAX_README_CELL = 300
ISSUE_LETTER = re.compile(r"\bissues? [A-Z]\b")
ISO_DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
# phrases that tell how a figure or a design came about instead of what holds now
NARRATION = [re.compile(p, re.IGNORECASE) for p in (
    r"\bbefore issue\b",
    r"\btried and not landed\b",
    r"\bstep \d+: the\b",
    r"\bplan for the\b",
    r"\b(?:this|that|the previous|the next|an earlier|a later|earlier|later|previous|next) session\b",
    r"\bsession of\b",
    r"\bthe session's\b",
    r"\bthe final tree\b",
    r"\bA (?:second|third|fourth|fifth|sixth|seventh)(?: run)?, after\b",
    r"\b(?:fourth|fifth|sixth|seventh) run\b",
    r"\brun of \d",
    r"\buntil (?:issue|20\d\d)\b",
    r"\b(?:earlier|previous) (?:run|measurement)s? (?:of this|gave)\b",
    r"\bwithdrawn\b",
    r"\bthe same day\b",
    r"\bthis session\b",
)]


def pages():
    files = [os.path.join(ROOT, "README.md")]
    docs = os.path.join(ROOT, "docs")
    files += [os.path.join(docs, n) for n in sorted(os.listdir(docs)) if n.endswith(".md")]
    return files


def hits(path, pattern):
    with open(path, encoding="utf-8") as f:
        return [f"{os.path.relpath(path, ROOT)}:{n}: {m.group(0)!r}"
                for n, line in enumerate(f, 1) for m in pattern.finditer(line)]


@pytest.mark.parametrize("path", pages(), ids=lambda p: os.path.relpath(p, ROOT))
def test_no_issue_letters_dates_or_narration(path):
    found = hits(path, ISSUE_LETTER) + hits(path, ISO_DATE)
    for pattern in NARRATION:
        found += hits(path, pattern)
    assert not found, "history belongs in CHANGELOG.md, the pages say what holds now: " + "; ".join(found)


def test_readme_is_a_front_page():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines, at most {MAX_README_LINES}"
    long_cells = [(n, len(cell.strip())) for n, line in enumerate(lines, 1) if line.lstrip().startswith("|")
                  for cell in line.strip().strip("|").split("|") if len(cell.strip()) > MAX_README_CELL]
    assert not long_cells, f"README.md table cells over {MAX_README_CELL} characters (line, length): {long_cells}"


def test_the_patterns_catch_what_they_are_for():
    """Each check fails on a line of the kind it guards against and passes on its present-tense rewrite."""
    assert ISSUE_LETTER.search("0.545 s vs 0.868 s before issue N") and not ISSUE_LETTER.search("an issue, N = 3")
    assert ISO_DATE.search("Tried and not landed (2026-11-26)") and not ISO_DATE.search("version 2026.1.0")
    narrated = ["A fourth, after the heap change: 0.95", "## Step 2: the ops (built)", "the previous session's run",
                "**Tried and not landed:**", "on the final tree per thread", "until 2026-11-27 they held 16 384"]
    for line in narrated:
        assert any(p.search(line) for p in NARRATION), line
    present = ["The first run downloads MegEngine", "each of which fits a working session on 2 cores",
               "with a SessionLog START at its first step", "## The ops"]
    for line in present:
        assert not any(p.search(line) for p in NARRATION), line


SOURCE_SUFFIXES = (".py", ".cpp", ".h", ".cu", ".cuh")
# how code comments narrated a measurement instead of pointing to its results file
CODE_NARRATION = [re.compile(p, re.IGNORECASE) for p in (
    r"\b(?:busy|quiet|loaded) \d+-core machine\b",
    r"\bC\+\+ harness, 20\d\d\b",
    r"\bmeasured here\b",
    r"\bon this machine\)",
    r"\bnow \(\d+ threads? here\)",
)]
# a path a comment points to: it must exist (a measurement's results file, a script, another source)
POINTED_PATH = re.compile(r"(?<![\w/.~])(?:basebn|results|benchmarks|experiments|scripts|docs|tests)/[\w/.-]+"
                          r"\.(?:json|csv|py|md|cpp|h|cu|cuh)\b")


def sources():
    found = []
    for folder, _, names in os.walk(os.path.join(ROOT, "basebn")):
        found += [os.path.join(folder, n) for n in sorted(names) if n.endswith(SOURCE_SUFFIXES)]
    return sorted(found)


def test_code_comments_state_the_rule_and_point_to_existing_files():
    """basebn's comments and docstrings: no issue letters, dates or run narration (as the pages), and every
    file they point to (a results file, a benchmark, a source) exists."""
    found = []
    for path in sources():
        for pattern in [ISSUE_LETTER, ISO_DATE] + NARRATION + CODE_NARRATION:
            found += hits(path, pattern)
        with open(path, encoding="utf-8") as f:
            found += [f"{os.path.relpath(path, ROOT)}:{n}: {m.group(0)} does not exist"
                      for n, line in enumerate(f, 1) for m in POINTED_PATH.finditer(line)
                      if not os.path.exists(os.path.join(ROOT, m.group(0).rstrip(".")))]
    assert not found, "comments say the rule and point to its measurement: " + "; ".join(found)


def test_the_code_patterns_catch_what_they_are_for():
    narrated = ["(single-thread C++ harness, busy 2-core machine, 2026-11-26)",
                "and 2.5 at 2 (C++ harness, 2026-11-26)",
                "1.8 ms for its statistics, 0.39 ms now (1 thread here)", "(~0.6 ms of dispatch on this machine)"]
    for line in narrated:
        assert any(p.search(line) for p in CODE_NARRATION + [ISO_DATE]), line
    assert not any(p.search("more than this machine's memory") for p in CODE_NARRATION)
    assert POINTED_PATH.findall("see basebn/layers/bn_ops/build.py, results/linear.json.") == [
        "basebn/layers/bn_ops/build.py", "results/linear.json"]
    assert POINTED_PATH.findall("~/.cache/basebn/kernels and a/tests/x.py") == []
