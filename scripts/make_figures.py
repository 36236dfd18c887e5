"""Regenerates the figure tables of README.md and docs/figures.md, and the experiment tables of the user guide,
from the results files (results/*.json).

    python scripts/make_figures.py            # rewrite the tables between the pages' figures markers
    python scripts/make_figures.py --check    # exit 1 and name the pages whose tables differ (nothing written)

Each results file lists ``rows``: a figure, which run it comes from (``run``: an id, or ``kind``: the last run of
that kind that has the figure, so a new run of a benchmark replaces the figure) and where in that run's ``figures``
the number is (``value``: a path; ``range``: several paths, shown as min–max), with a ``format``. A row with a
``headline`` text also goes into the README's table. Every row links its results file; older runs stay in the file.
A docs page's ``<!-- table:NAME:start -->`` ... ``<!-- table:NAME:end -->`` block is results/NAME.json's table,
rendered by scripts/experiment_tables.py.
"""
import argparse
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from experiment_tables import RENDERERS  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "results")
START, END = "<!-- figures:start -->", "<!-- figures:end -->"
# the sections of docs/figures.md, in page order; a results file names its own, and its "order" within it
SECTIONS = ["Training step", "BN layers and kernels", "Convolutions, pooling, Linear", "CPU runtime settings",
            "Memory, trainer, EMA, SyncBN", "CUDA kernels", "Experiments"]
MAX_HEADLINE_ROWS = 10
TABLE_MARKER = re.compile(r"<!-- table:([\w.-]+):start -->\n.*?<!-- table:\1:end -->", re.S)


class FiguresError(ValueError):
    """A results file or a page that the tables cannot be made from (the message names the file and row)."""


def load_results(folder=RESULTS):
    """{file name: parsed results file}, sorted by name."""
    out = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".json"):
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                out[name] = json.load(f)
    return out


def lookup(figures, path):
    """The value at ``path`` (keys and list indices) in a run's figures; KeyError/IndexError/TypeError if absent."""
    value = figures
    for key in path:
        value = value[key]
    if value is None:
        raise KeyError(path)
    return value


def row_paths(row):
    return [row["value"]] if "value" in row else list(row["range"])


def pick_run(name, data, row):
    """The run a row shows: the one named by ``run``, else the last run of ``kind`` that has all of its paths."""
    paths = row_paths(row)

    def has_all(run):
        try:
            for p in paths:
                lookup(run["figures"], p)
        except (KeyError, IndexError, TypeError):
            return False
        return True

    if "run" in row:
        runs = [r for r in data["runs"] if r["id"] == row["run"]]
    else:
        runs = [r for r in data["runs"] if r.get("kind") == row.get("kind")]
    runs = [r for r in runs if has_all(r)]
    if not runs:
        raise FiguresError(f"results/{name}: no run has the figure of row {row['figure']!r}")
    return runs[-1]


def _bounds(value):
    if isinstance(value, dict) and "min" in value and "max" in value:
        return value["min"], value["max"]
    if isinstance(value, (int, float)):
        return value, value
    raise FiguresError(f"not a number or a min/max range: {value!r}")


def cell(name, data, row):
    """(the formatted figure, the run it comes from) for one row."""
    run = pick_run(name, data, row)
    try:
        if "value" in row:
            value = lookup(run["figures"], row["value"])
            fields = value if isinstance(value, dict) else {"v": value}
        else:
            bounds = [_bounds(lookup(run["figures"], p)) for p in row["range"]]
            fields = {"min": min(b[0] for b in bounds), "max": max(b[1] for b in bounds)}
        text = row["format"].format_map(fields)
    except (KeyError, IndexError, ValueError, TypeError) as e:
        raise FiguresError(f"results/{name}: row {row['figure']!r} cannot be formatted ({e})") from None
    return text, run


def table(entries, link_prefix, label):
    """Markdown table lines: one row per (file name, data, row), the figure, the host, a link to the file."""
    lines = ["| figure | result | measured on | data |", "|---|---|---|---|"]
    for name, data, row in entries:
        text, run = cell(name, data, row)
        lines.append(f"| {label(row)} | {text} | {run['host']['name']} | "
                     f"[{name[:-5]}]({link_prefix}{name}) |")
    return lines


def in_section(results, section):
    """[(file name, data)] of one section, by each file's "order", then name."""
    return sorted(((n, d) for n, d in results.items() if d.get("section") == section),
                  key=lambda nd: (nd[1].get("order", 0), nd[0]))


def readme_block(results):
    """The README's headline table: every row with a ``headline``, files in SECTIONS order."""
    entries = [(n, d, r) for sec in SECTIONS for n, d in in_section(results, sec) for r in d["rows"]
               if r.get("headline")]
    if len(entries) > MAX_HEADLINE_ROWS:
        raise FiguresError(f"{len(entries)} headline rows: the README shows at most {MAX_HEADLINE_ROWS}")
    return "\n".join(table(entries, "results/", lambda r: r["headline"]))


def figures_block(results):
    """docs/figures.md's tables: one section per SECTIONS entry, then each file's command."""
    unknown = sorted(n for n, d in results.items() if d.get("section") not in SECTIONS)
    if unknown:
        raise FiguresError(f"results files with a section not in make_figures.SECTIONS: {', '.join(unknown)}")
    out = []
    for sec in SECTIONS:
        files = in_section(results, sec)
        out += [f"## {sec}", ""]
        out += table([(n, d, r) for n, d in files for r in d["rows"]], "../results/", lambda r: r["figure"])
        out += ["", "| data | what it measures | command |", "|---|---|---|"]
        out += [f"| [{n[:-5]}](../results/{n}) | {d['what']} | `{d['command']}` |" for n, d in files]
        out.append("")
    return "\n".join(out).rstrip("\n")


def replace_block(text, block, page):
    """``text`` with the part between the figures markers replaced by ``block``."""
    if text.count(START) != 1 or text.count(END) != 1 or text.index(START) > text.index(END):
        raise FiguresError(f"{page}: needs one {START} line before one {END} line")
    head, rest = text.split(START)
    _, tail = rest.split(END)
    return f"{head}{START}\n{block}\n{END}{tail}"


def replace_tables(text, results, page):
    """``text`` with every experiment-table block rendered again from its results file."""
    def render(match):
        name = match.group(1)
        if name not in RENDERERS or f"{name}.json" not in results:
            raise FiguresError(f"{page}: table {name!r} needs results/{name}.json and a renderer in "
                               f"scripts/experiment_tables.py")
        try:
            table = RENDERERS[name](results[f"{name}.json"])
        except (KeyError, IndexError, ValueError, TypeError) as e:
            raise FiguresError(f"results/{name}.json: its table cannot be rendered ({e!r})") from None
        return f"<!-- table:{name}:start -->\n{table}\n<!-- table:{name}:end -->"
    return TABLE_MARKER.sub(render, text)


def table_pages(root=ROOT):
    """The docs pages that hold experiment-table blocks."""
    folder = os.path.join(root, "docs")
    out = []
    for name in sorted(os.listdir(folder)):
        if name.endswith(".md"):
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                if "<!-- table:" in f.read():
                    out.append(os.path.join("docs", name))
    return out


def pages(results, root=ROOT):
    """{page path: (its current text, the text generated from the results files)}."""
    out = {}
    for page, make in (("README.md", readme_block), (os.path.join("docs", "figures.md"), figures_block)):
        with open(os.path.join(root, page), encoding="utf-8") as f:
            text = f.read()
        out[page] = (text, replace_block(text, make(results), page))
    for page in table_pages(root):
        with open(os.path.join(root, page), encoding="utf-8") as f:
            text = f.read()
        out[page] = (text, replace_tables(text, results, page))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only report pages that differ (exit 1), write nothing")
    args = ap.parse_args(argv)
    try:
        generated = pages(load_results())
    except (FiguresError, OSError, json.JSONDecodeError) as e:
        print(f"make_figures: {e}", file=sys.stderr)
        return 2
    stale = [page for page, (old, new) in generated.items() if old != new]
    if args.check:
        for page in stale:
            print(f"{page} differs from its results files: run `make figures`")
        return 1 if stale else 0
    for page in stale:
        with open(os.path.join(ROOT, page), "w", encoding="utf-8") as f:
            f.write(generated[page][1])
        print(f"rewrote the figures of {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
