# Every install step lives here, so a fresh machine with only Python and make
# can run the README's commands.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: install
	$(BIN)/python examples/quickstart.py

test: install
	$(BIN)/python -m ruff check .
	$(BIN)/python -m pytest -q

lint: install
	$(BIN)/python -m ruff check .

bench: install
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info
