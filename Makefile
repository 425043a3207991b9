# Everything a new machine needs comes from here: a virtual environment with the project and its extras.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast lint install bench clean-demo

NATIVE_SOURCES := $(wildcard commitlog/csrc/*.c commitlog/csrc/*.h)

# The editable install compiles the extension; a changed C file rebuilds it.
$(STAMP): pyproject.toml setup.py $(NATIVE_SOURCES)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[spark,test,bench]'
	touch $(STAMP)

install: $(STAMP)

# The main job: a demo store under ./demo-store, written, read back and summarised.
demo: $(STAMP)
	$(BIN)/python -m mqstore demo

# The linter (rules and line length in pyproject.toml), then the whole test suite. pytest's exit code 5 (no test
# collected) is reported as a failure with a reason.
test: lint
	@$(BIN)/python -m pytest; status=$$?; \
	if [ $$status -eq 5 ]; then echo "pytest collected no test: failing on purpose"; fi; \
	exit $$status

lint: $(STAMP)
	$(BIN)/ruff check .

# The quick loop while working: lint, then every test not marked spark, crash or slow.
test-fast: lint
	$(BIN)/python -m pytest -q -m "not spark and not crash and not slow"

bench: $(STAMP)
	$(BIN)/python bench/put_get.py

clean-demo:
	rm -rf demo-store
