# Every install step lives here, so a fresh machine with only Python and make
# can run the README's commands.
PYTHON ?= python3
# One venv per JAX release: `make install JAX=0.8.3` (or `make test-suite
# JAX=0.8.3`) makes .venv-jax0.8.3 with exactly jax and jaxlib 0.8.3 and the
# newest release of every other dependency that installs with them. Without
# JAX, .venv gets what pip picks for this Python (JAX 0.10.2 on 3.11).
JAX ?=
VENV ?= $(if $(JAX),.venv-jax$(JAX),.venv)
BIN := $(VENV)/bin
JAX_PIN := $(if $(JAX),-c $(VENV)/jax-pin.txt)
BASE_STAMP := $(VENV)/.installed-base
STAMP := $(VENV)/.installed
WHEEL_DIR := build/wheel-check

# The second supported JAX (0.12.x) needs Python 3.12. Under pyenv `python3.12`
# may be a shim that does not resolve, so ask pyenv for the interpreter too.
PYTHON312 ?= $(shell for p in python3.12 "$$(pyenv prefix 3.12 2>/dev/null | head -n 1)/bin/python3.12"; do \
  "$$p" -c 'import sys; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1 && { command -v "$$p" || echo "$$p"; } && break; done)
VENV312 ?= .venv312

# The oldest supported JAX (the whole suite runs on it, as on 0.10.2 and
# 0.12.x), and every other supported minor release (its newest patch: import,
# quickstart and the fuzzers' CI budget), on Python 3.11 and, from JAX 0.11
# on, Python 3.12.
JAX_OLDEST ?= 0.8.3
JAX_MINORS ?= 0.9.2
JAX_MINORS_312 ?= 0.11.2
VENV_OLDEST := .venv-jax$(JAX_OLDEST)
# The interpreters the cross-release checkpoint test writes and reads with
# (tests/test_cross_release.py); under make test each must exist.
RELEASE_PYTHONS := $(abspath .venv)/bin/python $(abspath $(VENV_OLDEST))/bin/python \
  $(if $(PYTHON312),$(abspath $(VENV312))/bin/python)

.PHONY: install demo test test-venvs test-default test-jax012 test-jax-oldest test-jax-minors \
  test-suite test-minor wheel-check docs lint typecheck bench bench-check fuzz mutate notebooks \
  chromium clean

install: $(STAMP)

# The package alone (its run-time dependencies): all the demo needs.
$(BASE_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(if $(JAX),printf 'jax==$(JAX)\njaxlib==$(JAX)\n' > $(VENV)/jax-pin.txt)
	$(BIN)/python -m pip install --quiet $(JAX_PIN) -e .
	touch $(BASE_STAMP)

# Every extra and the test tools.
$(STAMP): $(BASE_STAMP)
	$(BIN)/python -m pip install --quiet $(JAX_PIN) -e '.[test]'
	touch $(STAMP)

demo: $(BASE_STAMP)
	$(BIN)/python examples/quickstart.py

# The wheel a user installs: built from this tree (no tests inside), installed
# with its extras into a new venv, and run outside the repository.
wheel-check: install
	rm -rf $(WHEEL_DIR) && mkdir -p $(WHEEL_DIR)/run
	$(BIN)/python -m pip wheel --quiet --no-deps --wheel-dir $(WHEEL_DIR)/dist .
	$(BIN)/python -c 'import glob, zipfile; names = zipfile.ZipFile(glob.glob("$(WHEEL_DIR)/dist/*.whl")[0]).namelist(); \
	  bad = [n for n in names if n.split("/")[0] in ("tests", "examples", "benchmarks", "docs")]; assert not bad, bad'
	$(PYTHON) -m venv $(WHEEL_DIR)/venv
	$(WHEEL_DIR)/venv/bin/python -m pip install --quiet \
	  "$$(ls $(WHEEL_DIR)/dist/*.whl)[checkpoint,notebook,port]"
	cp examples/quickstart.py $(WHEEL_DIR)/run/
	cd $(WHEEL_DIR)/run && ../venv/bin/python -c \
	  'import jax_sharding_ext as m, sys; assert "/venv/" in m.__file__, m.__file__; print("installed at", m.__file__)'
	cd $(WHEEL_DIR)/run && ../venv/bin/python quickstart.py >/dev/null && echo "wheel-check: quickstart ran from the installed wheel"

# The README's test command and CI: lint, then the whole suite on the oldest
# supported JAX (Python 3.11 + JAX 0.8.3), on Python 3.11 + JAX 0.10.2 and on
# Python 3.12 + JAX 0.12.x; import, quickstart and the fuzzers on every other
# supported minor (JAX 0.9.2, 0.11.2); the wheel and the documentation build.
# Every venv is made first (the cross-release checkpoint test needs the
# others); then the runs share the machine, TEST_JOBS at a time (a suite
# keeps about half a core busy: much of it waits for worker processes,
# kernels and subprocesses), each run's output printed whole when it ends.
TEST_JOBS ?= 6
test: test-venvs chromium
	$(MAKE) --no-print-directory -j$(TEST_JOBS) --output-sync=recurse \
	  test-default test-jax012 test-jax-oldest test-jax-minors wheel-check docs

test-venvs:
	$(MAKE) --no-print-directory install
	$(MAKE) --no-print-directory install JAX=$(JAX_OLDEST)
	@for v in $(JAX_MINORS); do $(MAKE) --no-print-directory install JAX=$$v || exit 1; done
	@if [ -n "$(PYTHON312)" ]; then \
	  $(MAKE) --no-print-directory install PYTHON="$(PYTHON312)" VENV=$(VENV312) && \
	  for v in $(JAX_MINORS_312); do \
	    $(MAKE) --no-print-directory install JAX=$$v PYTHON="$(PYTHON312)" || exit 1; done; fi

test-default: install chromium
	$(BIN)/python -m ruff check .
	$(BIN)/python -m mypy
	JSE_RELEASE_PYTHONS="$(RELEASE_PYTHONS)" $(BIN)/python -m pytest -q

test-jax012: chromium
	@if [ -z "$(PYTHON312)" ]; then \
	  echo "NOTE: Python 3.12 not found, so the suite did NOT run on JAX 0.12.x."; \
	  echo "      Install python3.12 (or set PYTHON312=/path/to/python3.12) to run it."; \
	else \
	  echo "== The suite on $(PYTHON312) (JAX 0.12.x) in $(VENV312)"; \
	  $(MAKE) --no-print-directory test-suite PYTHON="$(PYTHON312)" VENV=$(VENV312); \
	fi

test-jax-oldest: chromium
	@echo "== The suite on the oldest supported JAX ($(JAX_OLDEST)) in $(VENV_OLDEST)"
	$(MAKE) --no-print-directory test-suite JAX=$(JAX_OLDEST)

test-jax-minors:
	@for v in $(JAX_MINORS); do \
	  echo "== Import, quickstart and fuzzers on JAX $$v in .venv-jax$$v"; \
	  $(MAKE) --no-print-directory test-minor JAX=$$v || exit 1; \
	done
	@if [ -z "$(PYTHON312)" ]; then \
	  echo "NOTE: Python 3.12 not found, so JAX $(JAX_MINORS_312) was NOT tested."; \
	else for v in $(JAX_MINORS_312); do \
	  echo "== Import, quickstart and fuzzers on JAX $$v in .venv-jax$$v (Python 3.12)"; \
	  $(MAKE) --no-print-directory test-minor JAX=$$v PYTHON="$(PYTHON312)" || exit 1; \
	done; fi

# mypy and the whole suite in one venv (VENV, or JAX=...).
test-suite: install
	$(BIN)/python -c 'import jax; print("jax", jax.__version__)'
	$(BIN)/python -m mypy
	JSE_RELEASE_PYTHONS="$(RELEASE_PYTHONS)" $(BIN)/python -m pytest -q

# A supported minor release that does not run the whole suite (JAX=...).
test-minor: install
	$(BIN)/python -c 'import jax, jax_sharding_ext; print("jax", jax.__version__, "imports jax_sharding_ext")'
	$(BIN)/python examples/quickstart.py >/dev/null && echo "quickstart ran on JAX $(JAX)"
	$(BIN)/python -m pytest -q -m fuzz -p no:cacheprovider

lint: install
	$(BIN)/python -m ruff check .

# The package's types (pyproject [tool.mypy]); part of make test.
typecheck: install
	$(BIN)/python -m mypy

bench: install
	$(BIN)/python benchmarks/run_all.py

# The dispatch-bound benchmarks (dispatch, legacy pjit, training loop, guard and
# ledger, dispatch by leaves) against the committed benchmarks/results.json:
# fails when a ratio is more than 10% worse (a few minutes; on a quiet machine).
bench-check: install
	$(BIN)/python benchmarks/check.py

# The fuzzers at length (minutes): JSE_FUZZ_SCALE times the examples they run
# in make test, from a new seed, printed first (`make fuzz SEED=...` repeats a
# run). A failing example is shrunk and saved as a test under tests/found/.
SEED ?= $(shell date +%s)
JSE_FUZZ_SCALE ?= 20
fuzz: install
	@echo "make fuzz: seed $(SEED); repeat with: make fuzz SEED=$(SEED)"
	JSE_FUZZ=1 JSE_FUZZ_SEED=$(SEED) JSE_FUZZ_SCALE=$(JSE_FUZZ_SCALE) \
	  $(BIN)/python -m pytest -q -m fuzz -p no:cacheprovider --hypothesis-seed=$(SEED)

# The mutation check (tens of minutes; not part of make test): each mutant of
# mutate/mutants.py in a copy of the tree, its area's fuzzers then its tests;
# a survivor fails. It writes the table on docs/development.md.
# MUTATE_ARGS="--only ID ..." or "--area AREA ..." runs some.
MUTATE_ARGS ?= --write-docs
mutate: install
	$(BIN)/python mutate/run.py $(MUTATE_ARGS)

# The documentation site (Sphinx + myst-nb) into build/docs. Any warning fails
# the build; it runs the example notebooks (DOCS_EXECUTE=off shows their
# committed outputs instead) and needs no network.
DOCS_EXECUTE ?= force
docs: install
	rm -rf build/docs
	$(BIN)/python -m sphinx -W --keep-going -E -q -b html -D nb_execution_mode=$(DOCS_EXECUTE) docs build/docs
	@echo "docs: build/docs/index.html"

# Re-execute the example notebooks and save them with their outputs.
notebooks: install
	$(BIN)/python -m nbconvert --to notebook --execute --inplace examples/*.ipynb

# The browser test drives the system Chromium (Debian package `chromium`).
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && apt-get install -y -qq chromium >/dev/null; \
	  else echo "NOTE: chromium not found and cannot apt-get it; the browser test will skip."; fi; }

clean:
	rm -rf .venv .venv-jax* $(VENV312) build *.egg-info
