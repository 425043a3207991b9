# Everything a new machine needs comes from here: a virtual environment with the project and its extras.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-python install bench clean-demo fuzz-codec

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

# The whole test suite. pytest's exit code 5 (no test collected) is reported as a failure with a reason.
test: $(STAMP)
	@$(BIN)/python -m pytest; status=$$?; \
	if [ $$status -eq 5 ]; then echo "pytest collected no test: failing on purpose"; fi; \
	exit $$status

# The whole suite with the pure-Python codec (the compiled one stays built: the codec tests compare the two).
test-python: $(STAMP)
	MQSTORE_NATIVE=0 $(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/python bench/put_get.py

clean-demo:
	rm -rf demo-store

# Fuzz the record decoder and writer (commitlog/csrc/fuzz/fuzz_codec.c) for SECONDS, under AddressSanitizer and
# UndefinedBehaviorSanitizer, from seeds of real records (the RocketMQ fixture store when there, and a store the
# seed script writes). With clang: libFuzzer, coverage-guided; without it: gcc and a mutating driver.
SECONDS ?= 60
FUZZ_DIR ?= build/fuzz
FUZZ_PYTHON ?= $(BIN)/python
ROCKETMQ_FIXTURE_STORE ?= ../shared/fixtures/rocketmq-4.4.0-store/store
FUZZ_SOURCES := commitlog/csrc/fuzz/fuzz_codec.c commitlog/csrc/record.c commitlog/csrc/crc32.c
FUZZ_FLAGS := -O1 -g -std=c11 -Wall -Wextra -fno-omit-frame-pointer -fno-sanitize-recover=all -Icommitlog/csrc
fuzz-codec:
	mkdir -p $(FUZZ_DIR)
	rm -rf $(FUZZ_DIR)/codec-seeds
	$(FUZZ_PYTHON) commitlog/csrc/fuzz/make_seeds.py $(FUZZ_DIR)/codec-seeds $(wildcard $(ROCKETMQ_FIXTURE_STORE))
	@if command -v clang >/dev/null 2>&1; then \
	  set -x; clang $(FUZZ_FLAGS) -fsanitize=fuzzer,address,undefined $(FUZZ_SOURCES) -lz -o $(FUZZ_DIR)/fuzz_codec && \
	  mkdir -p $(FUZZ_DIR)/codec-corpus && \
	  $(FUZZ_DIR)/fuzz_codec -max_total_time=$(SECONDS) -artifact_prefix=$(FUZZ_DIR)/ $(FUZZ_DIR)/codec-corpus $(FUZZ_DIR)/codec-seeds; \
	else \
	  set -x; $(CC) $(FUZZ_FLAGS) -fsanitize=address,undefined $(FUZZ_SOURCES) commitlog/csrc/fuzz/driver_codec.c -lz \
	    -o $(FUZZ_DIR)/fuzz_codec && cd $(FUZZ_DIR) && ./fuzz_codec $(SECONDS) codec-seeds; \
	fi
