# Set-up and checks. `make demo` and `make test` work from a fresh clone.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# The CPU wheel of this torch is what the tests run against; pyproject keeps
# the range loose (torch>=2.4) for users.
TORCH_PIN := torch==2.13.0
# Where `make docs-build` writes the site (`make test` builds into a temporary folder).
SITE ?= site

.PHONY: venv install install-test install-docs horovod demo test test-gpu soak soak-full matrix bench docs docs-build clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

venv: $(PY)

# Stamps: pip runs again only when pyproject.toml or the pin changes (a
# no-op pip install of an editable package still takes seconds).
INSTALLED := $(VENV)/.installed
TEST_INSTALLED := $(VENV)/.installed-test
DOCS_INSTALLED := $(VENV)/.installed-docs
EXAMPLES_INSTALLED := $(VENV)/.installed-examples

$(INSTALLED): pyproject.toml Makefile | $(PY)
	$(PIP) install --quiet $(TORCH_PIN)
	$(PIP) install --quiet -e .
	touch $@

$(TEST_INSTALLED): $(INSTALLED)
	$(PIP) install --quiet -e '.[test]'
	touch $@

install: $(INSTALLED)

install-test: $(TEST_INSTALLED)

$(DOCS_INSTALLED): $(INSTALLED)
	$(PIP) install --quiet -e '.[docs]'
	touch $@

install-docs: $(DOCS_INSTALLED)

$(EXAMPLES_INSTALLED): $(INSTALLED)
	$(PIP) install --quiet -e '.[examples]'
	touch $@

horovod: install
	bash scripts/install-horovod.sh $(PY)

# The core under torchrun (no Ray), then what raydist is for: a rank killed
# mid-training, a spare in its place with the state from memory, the loss
# going on, the summary, and the timeline drawn as build/demo/timeline.png.
# The examples extra is matplotlib, for the picture only.
demo: $(EXAMPLES_INSTALLED)
	$(PY) -m torch.distributed.run --standalone --nproc-per-node 2 examples/core_demo.py
	$(PY) examples/recovery_demo.py --out build/demo

# Lint and format (ruff), the unit tier (pure rules, no Ray, under a minute),
# the type check and the docs build (warnings are errors: a broken link, a
# missing page) run before the horovod build and the live tier, so a broken
# rule fails fast. The live tier runs in two processes, each with its own Rays
# (a file whole in one; tests/conftest.py hands the longest files out first):
# a quarter of one process's time is spent waiting (a death, a timeout,
# a Ray starting), which the other fills.
test: install-test
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m pytest -q -n 2 tests/unit
	$(PY) -m mypy
	@site=$$(mktemp -d) && $(MAKE) --no-print-directory docs-build SITE="$$site"; status=$$?; rm -rf "$$site"; exit $$status
	$(MAKE) horovod
	$(PY) -m pytest -q -m "not soak" -n 2 --dist loadfile --no-loadscope-reorder --max-worker-restart 0 --durations=15 tests/live

# The repetition variants (layout runs, failing runs, driver exits, 200
# horovod re-inits): leaks and rare races that a short run would miss, at
# the counts CI runs after every session (`make soak-full`: at the counts
# the acceptance lists asked for, 20 and 30 runs); the behaviours `make test` checks
# once, again through their other entry points, shapes and examples; and
# the live tests whose behaviour `make test` shows through another (each
# names it). In two processes, as the live tier of `make test` (a process
# that dies is not replaced: pytest-xdist's file-by-file handing out then
# waits forever for the dead process's files; the run stops, naming the test). A test still
# running after 200 s prints every thread's stack (and goes on): a process
# lost to its timeout under xdist says nothing of where it waited.
soak: install-test horovod
	$(PY) -m pytest -q -m soak -n 2 --dist loadfile --no-loadscope-reorder --max-worker-restart 0 --durations=15 -o faulthandler_timeout=200 tests/live

soak-full: export RAYDIST_SOAK_FULL := 1
soak-full: soak

# The version matrix (noxfile.py): raydist's wheel on the newest Python, torch
# and Ray, and on the oldest pyproject.toml claims (pyenv's 3.13 and 3.9), each
# with the unit tier and a live smoke subset; torch from the package index.
matrix: install-test
	$(PY) -m nox

# The GPU tier (tests/gpu), on a machine with a CUDA GPU; elsewhere every test
# is skipped, saying why. Not part of `make test`. It installs nothing and needs
# only pytest beside raydist's dependencies: on a machine without the venv,
# `make test-gpu PY=python3` (scripts/gpu-check.sh does, with the benchmark).
test-gpu:
	$(PY) -m pytest -q -rs --durations=10 tests/gpu

# The documentation site, into site/ (open site/index.html).
docs: install-docs
	$(MAKE) --no-print-directory docs-build

# The one docs build of `make docs` and `make test`: every warning (a broken
# link or anchor, a page missing) is an error. Not --quiet: it drops the
# warnings before --strict counts them.
docs-build:
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir "$(SITE)"

bench: install
	$(PIP) install --quiet -e '.[bench]' $(TORCH_PIN)
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) build site *.egg-info .pytest_cache
