# Everything a new machine needs comes from here: a virtual environment with the project and its extras.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast test-python lint install bench docs clean-demo fuzz fuzz-scan fuzz-codec

NATIVE_SOURCES := $(wildcard commitlog/csrc/*.c commitlog/csrc/*.h)

# The editable install compiles the extension; a changed C file rebuilds it.
$(STAMP): pyproject.toml setup.py $(NATIVE_SOURCES)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[spark,test,bench]'
	$(BIN)/python -m mqstore.spark.jvm
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

# The whole suite with the pure-Python codec (the compiled one stays built: the codec tests compare the two).
test-python: $(STAMP)
	MQSTORE_NATIVE=0 $(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/python bench/put_get.py

# Regenerate the generated documentation: docs/settings.md from StoreConfig, bench/README.md's tables from
# bench/results/*.json (tests/test_docs.py fails while either is out of date).
docs: $(STAMP)
	$(BIN)/python docs/generate.py
	$(BIN)/python bench/report.py --write

clean-demo:
	rm -rf demo-store

# The fuzz targets beside the C they fuzz (commitlog/csrc/fuzz/), under AddressSanitizer and
# UndefinedBehaviorSanitizer, for SECONDS seconds each, from seeds cut from real stores (the RocketMQ fixture in
# tests/data and a store the seed scripts write): libFuzzer when clang is there, else a mutating driver built with
# gcc. A crash leaves its input in $(FUZZ_DIR).
SECONDS ?= 60
FUZZ_DIR ?= build/fuzz
FUZZ_PYTHON ?= $(BIN)/python
ROCKETMQ_FIXTURE_STORE ?= tests/data/rocketmq-4.4.0-store/store
FUZZ_SCAN_SOURCES := commitlog/csrc/fuzz/fuzz_scan.c commitlog/csrc/fuzz/fuzz_index.c commitlog/csrc/scan_core.c \
	commitlog/csrc/arrow_core.c commitlog/csrc/index_core.c commitlog/csrc/crc32.c
FUZZ_SCAN_FLAGS := -g -O1 -fno-omit-frame-pointer -fno-sanitize-recover=all -I$$($(FUZZ_PYTHON) -c \
	"import sysconfig; print(sysconfig.get_paths()['include'])")
FUZZ_CODEC_SOURCES := commitlog/csrc/fuzz/fuzz_codec.c commitlog/csrc/record.c commitlog/csrc/crc32.c
FUZZ_CODEC_FLAGS := -O1 -g -std=c11 -Wall -Wextra -fno-omit-frame-pointer -fno-sanitize-recover=all -Icommitlog/csrc

fuzz: fuzz-scan fuzz-codec

fuzz-scan:
	mkdir -p $(FUZZ_DIR)/seeds $(FUZZ_DIR)/corpus
	$(FUZZ_PYTHON) commitlog/csrc/fuzz/make_scan_seeds.py $(FUZZ_DIR)/seeds
	if command -v clang >/dev/null; then \
		clang $(FUZZ_SCAN_FLAGS) -fsanitize=fuzzer,address,undefined $(FUZZ_SCAN_SOURCES) -lz -o $(FUZZ_DIR)/fuzz_scan && \
		cd $(FUZZ_DIR) && ./fuzz_scan -max_total_time=$(SECONDS) -artifact_prefix=./ corpus seeds; \
	else \
		gcc $(FUZZ_SCAN_FLAGS) -fsanitize=address,undefined $(FUZZ_SCAN_SOURCES) commitlog/csrc/fuzz/driver.c -lz \
			-o $(FUZZ_DIR)/fuzz_scan_driver && \
		cd $(FUZZ_DIR) && ./fuzz_scan_driver $(SECONDS) seeds/*; \
	fi

fuzz-codec:
	mkdir -p $(FUZZ_DIR)
	rm -rf $(FUZZ_DIR)/codec-seeds
	$(FUZZ_PYTHON) commitlog/csrc/fuzz/make_codec_seeds.py $(FUZZ_DIR)/codec-seeds $(wildcard $(ROCKETMQ_FIXTURE_STORE))
	@if command -v clang >/dev/null 2>&1; then \
	  set -x; clang $(FUZZ_CODEC_FLAGS) -fsanitize=fuzzer,address,undefined $(FUZZ_CODEC_SOURCES) -lz \
	    -o $(FUZZ_DIR)/fuzz_codec && mkdir -p $(FUZZ_DIR)/codec-corpus && \
	  $(FUZZ_DIR)/fuzz_codec -max_total_time=$(SECONDS) -artifact_prefix=$(FUZZ_DIR)/ $(FUZZ_DIR)/codec-corpus \
	    $(FUZZ_DIR)/codec-seeds; \
	else \
	  set -x; $(CC) $(FUZZ_CODEC_FLAGS) -fsanitize=address,undefined $(FUZZ_CODEC_SOURCES) \
	    commitlog/csrc/fuzz/driver_codec.c -lz -o $(FUZZ_DIR)/fuzz_codec && cd $(FUZZ_DIR) && \
	    ./fuzz_codec $(SECONDS) codec-seeds; \
	fi
