# Single entry points. `make quickstart` and `make test` set up .venv first if needed.
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup quickstart test test-fast test-flaky test-exhaustive bench figures docs clean-venv

$(STAMP): setup.py
	@PY310=$$(scripts/find_python310.sh) || exit 1; \
	[ -x $(PY) ] || $$PY310 -m venv $(VENV); \
	$(PY) -m pip install -q --upgrade pip && \
	$(PY) -m pip install -e ".[test]" && touch $(STAMP)

setup: $(STAMP)

quickstart: $(STAMP)
	$(PY) -m basebn.train configs/quickstart.py output_dir=runs/quickstart --restart
	$(PY) -m basebn.test configs/quickstart.py -w runs/quickstart

test: $(STAMP)
	$(PY) -m pytest -q -m "not megengine_flaky and not exhaustive" tests

# checks MegEngine 1.13's CPU gradient bug makes unreliable (tests/models/test_model_bn_features.py)
test-flaky: $(STAMP)
	$(PY) -m pytest -q -m megengine_flaky tests

# every model name through every check that sweeps them (deploy): an hour or more on 2 cores
test-exhaustive: $(STAMP)
	$(PY) -m pytest -q -m exhaustive tests

# the inner loop: no mpiexec launches, no package installs, no long runs
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not mpi and not slow and not megengine_flaky and not exhaustive" tests

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

# the README's headline table and docs/figures.md's tables, regenerated from results/*.json (standard library only)
figures:
	python3 scripts/make_figures.py

# the documentation site (MkDocs, in its own venv so basebn's dependencies stay as they are): site/index.html
DOCS_VENV := .venv-docs
docs:
	@[ -x $(DOCS_VENV)/bin/mkdocs ] || { python3 -m venv $(DOCS_VENV) && $(DOCS_VENV)/bin/pip install -q "mkdocs==1.6.1"; }
	$(DOCS_VENV)/bin/mkdocs build --strict --site-dir site

clean-venv:
	rm -rf $(VENV)
