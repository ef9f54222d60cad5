# Every install step lives here, so a fresh machine with only Python and make
# can run the README's commands.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
BASE_STAMP := $(VENV)/.installed-base
STAMP := $(VENV)/.installed
WHEEL_DIR := build/wheel-check

# The second supported JAX (0.12.x) needs Python 3.12. Under pyenv `python3.12`
# may be a shim that does not resolve, so ask pyenv for the interpreter too.
PYTHON312 ?= $(shell for p in python3.12 "$$(pyenv prefix 3.12 2>/dev/null | head -n 1)/bin/python3.12"; do \
  "$$p" -c 'import sys; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1 && { command -v "$$p" || echo "$$p"; } && break; done)
VENV312 ?= .venv312

.PHONY: install demo test test-default test-jax012 wheel-check docs lint typecheck bench bench-check fuzz mutate notebooks chromium clean

install: $(STAMP)

# The package alone (its run-time dependencies): all the demo needs.
$(BASE_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e .
	touch $(BASE_STAMP)

# Every extra and the test tools.
$(STAMP): $(BASE_STAMP)
	$(BIN)/python -m pip install --quiet -e '.[test]'
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

# The README's test command and CI: lint, then the suite on both supported
# JAX releases (Python 3.11 + JAX 0.10.2, Python 3.12 + JAX 0.12.x), the wheel
# and the documentation build.
test: test-default test-jax012 wheel-check docs

test-default: install chromium
	$(BIN)/python -m ruff check .
	$(BIN)/python -m mypy
	$(BIN)/python -m pytest -q

test-jax012: chromium
	@if [ -z "$(PYTHON312)" ]; then \
	  echo "NOTE: Python 3.12 not found, so the suite did NOT run on JAX 0.12.x."; \
	  echo "      Install python3.12 (or set PYTHON312=/path/to/python3.12) to run it."; \
	else \
	  echo "== The suite on $(PYTHON312) (JAX 0.12.x) in $(VENV312)"; \
	  $(MAKE) --no-print-directory install PYTHON="$(PYTHON312)" VENV=$(VENV312) && \
	  $(VENV312)/bin/python -c 'import jax; print("jax", jax.__version__)' && \
	  $(VENV312)/bin/python -m mypy && \
	  $(VENV312)/bin/python -m pytest -q; \
	fi

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
	rm -rf $(VENV) $(VENV312) build *.egg-info
