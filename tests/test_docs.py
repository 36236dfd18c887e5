"""The documentation holds together: every relative link and #anchor in README.md and docs/ resolves, and every
config key of basebn/config/defaults.py is documented somewhere in them.

Anchors follow GitHub's (and MkDocs' toc extension with GitHub-style slugs) rule, written here from its
definition: lower-case, drop every character that is not a letter, digit, space, hyphen or underscore, spaces
become hyphens; a repeated heading gets -1, -2, ... appended.
"""
import ast
import os
import re

import pytest

from basebn.config.defaults import DEFAULTS
from basebn.config.loader import flatten
from tests.support import ROOT

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def markdown_files():
    files = [os.path.join(ROOT, "README.md")]
    for folder, _, names in os.walk(os.path.join(ROOT, "docs")):
        files += [os.path.join(folder, n) for n in sorted(names) if n.endswith(".md")]
    return files


def prose_lines(path):
    """The lines of a markdown file outside fenced code blocks."""
    inside = False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if FENCE.match(line.strip()):
                inside = not inside
                continue
            if not inside:
                yield line


def slug(heading):
    text = re.sub(r"`|\*\*|\*", "", heading.strip()).lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading keeps its text
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    seen, out = {}, set()
    for line in prose_lines(path):
        m = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        out.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    return out


def links(path):
    for number, line in enumerate(prose_lines(path), 1):
        for m in LINK.finditer(re.sub(r"`[^`]*`", "", line)):
            target = m.group(1) or m.group(2)
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: are not checked (no network)
                yield number, target


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: os.path.relpath(p, ROOT))
def test_every_relative_link_and_anchor_resolves(path):
    broken = []
    for number, target in links(path):
        file_part, _, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
        if not os.path.exists(dest):
            broken.append(f"{target} (no file {os.path.relpath(dest, ROOT)})")
        elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
            broken.append(f"{target} (no heading #{anchor} in {os.path.relpath(dest, ROOT)})")
    assert not broken, f"{os.path.relpath(path, ROOT)}: " + "; ".join(broken)


def commented_keys():
    """Dotted keys of DEFAULTS whose line in defaults.py has a comment directly above it or on the same line."""
    path = os.path.join(ROOT, "basebn", "config", "defaults.py")
    with open(path, encoding="utf-8") as f:
        source = f.read()
    lines = source.splitlines()
    found = set()

    def walk(call, prefix):
        for kw in call.keywords:
            key = prefix + kw.arg
            above, own = lines[kw.lineno - 2].strip(), lines[kw.lineno - 1]
            if above.startswith("#") or "#" in own:
                found.add(key)
            if isinstance(kw.value, ast.Call) and getattr(kw.value.func, "id", None) == "dict":
                walk(kw.value, key + ".")

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "DEFAULTS":
            walk(node.value, "")
    return found


def test_every_config_key_is_documented():
    text = "".join(line for p in markdown_files() for line in open(p, encoding="utf-8"))
    named = set(re.findall(r"[A-Za-z_][\w.]*[\w]", text))
    commented = commented_keys()
    missing = [key for key in flatten(DEFAULTS) if key not in named and key not in commented]
    assert not missing, ("config keys neither named in README.md/docs/ nor commented in basebn/config/defaults.py: "
                         f"{missing}")
