# Everything a new machine needs comes from here: a virtual environment with the project and its extras.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-long test-fast test-python lint install bench docs clean-demo fuzz fuzz-scan fuzz-codec asan-build \
	test-asan fuzz-python

NATIVE_SOURCES := $(wildcard commitlog/csrc/*.c commitlog/csrc/*.h)

# The editable install compiles the extension; a changed C file rebuilds it.
$(STAMP): pyproject.toml setup.py $(NATIVE_SOURCES)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[spark,test,bench,fuzz]'
	$(BIN)/python -m mqstore.spark.jvm
	touch $(STAMP)

install: $(STAMP)

# The main job: a demo store under ./demo-store, written, read back and summarised.
demo: $(STAMP)
	$(BIN)/python -m mqstore demo

# The linter (rules and line length in pyproject.toml), then the whole test suite in TEST_WORKERS pytest-xdist
# workers (a test module's tests in one worker: its fixtures are made once), OWN_INTERPRETER after it in a pytest of
# its own: its gc sweeps walk the heap at every step, and the heap of a pytest that imported every test module makes
# them three times as slow. pytest's exit code 5 (no test collected) is reported as a failure with a reason; either
# run failing fails the target.
TEST_WORKERS ?= 2
OWN_INTERPRETER := tests/native/test_finalizers.py
# $(call suite,ENVIRONMENT,PYTEST_OPTIONS): every test not marked long, the workers' run then OWN_INTERPRETER's
define suite
	@$(1) $(BIN)/python -m pytest $(2) -n $(TEST_WORKERS) --dist loadfile -m "not long" \
		$(addprefix --ignore=,$(OWN_INTERPRETER)); status=$$?; \
	if [ $$status -eq 5 ]; then echo "pytest collected no test: failing on purpose"; fi; \
	$(1) $(BIN)/python -m pytest $(2) -m "not long" $(OWN_INTERPRETER); second=$$?; \
	if [ $$status -ne 0 ]; then exit $$status; fi; exit $$second
endef
test: lint
	$(call suite,,--durations=25)

lint: $(STAMP)
	$(BIN)/ruff check .

# The tests marked `long`, moved out of `make test` to keep it near 10 minutes on 2 cores; .ci/run runs them next.
test-long: $(STAMP)
	$(BIN)/python -m pytest -q -m long

# The quick loop while working: lint, then every test not marked spark, crash or slow.
test-fast: lint
	$(BIN)/python -m pytest -q -m "not spark and not crash and not slow"

# The suite with the pure-Python codec (the compiled one stays built: the codec tests compare the two), every test
# not marked long, as make test runs them (the workers, then OWN_INTERPRETER); CI runs it after the sanitizer pass.
test-python: $(STAMP)
	$(call suite,MQSTORE_NATIVE=0,-q)

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
	commitlog/csrc/arrow_core.c commitlog/csrc/index_core.c commitlog/csrc/record.c commitlog/csrc/crc32.c
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

# The compiled core built with AddressSanitizer and UndefinedBehaviorSanitizer (setup.py: MQSTORE_SANITIZE=1) into
# $(ASAN_DIR), beside the normal build, which stays in place. fuzz/sanitizer/sitecustomize.py makes every Python
# process started with $(ASAN_ENV) import it instead of the normal build, and the pytest plugin asan_check refuses to
# run unless it did. ASan's runtime must be the first library loaded, hence LD_PRELOAD (of gcc's libasan: gcc builds
# the module); PYTHONMALLOC=malloc sends Python's objects through ASan's malloc, so that a freed object read again is
# a heap-use-after-free; detect_leaks=0 because CPython does not free everything at exit, by design.
ASAN_DIR ?= $(CURDIR)/build/asan
ASAN_CC ?= gcc
ASAN_LIBRARY = $(ASAN_DIR)/lib/mqstore/commitlog/_native$(shell $(BIN)/python -c \
	"import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))" 2>/dev/null)
ASAN_RUNTIME = $(shell $(ASAN_CC) -print-file-name=libasan.so)
MQSTORE_WERROR ?= 1
ASAN_ENV = MQSTORE_NATIVE_LIBRARY=$(ASAN_LIBRARY) PYTHONPATH=$(CURDIR)/fuzz/sanitizer LD_PRELOAD=$(ASAN_RUNTIME) \
	PYTHONMALLOC=malloc ASAN_OPTIONS=detect_leaks=0:abort_on_error=0:print_summary=1 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# What the sanitizer pass runs: the tests of the compiled core and its bindings (tests/native, with the fuzz
# harnesses' short pass), the two-codec differential tests, the golden bytes, the compiled put, the flush gate, and
# the kill -9 series of the crash tests (writer processes, which load the sanitizer build too), the reader's map.
ASAN_TESTS ?= tests/native tests/unit/commitlog/test_native_codec.py tests/unit/commitlog/test_read_path_native.py \
	tests/unit/commitlog/test_arrow_properties_native.py tests/unit/mqstore/test_scan.py \
	tests/unit/mqstore/test_compiled_put.py tests/unit/timer/test_timer_link_compiled.py \
	tests/unit/mqstore/test_put_entry.py tests/unit/flush/test_flushwait.py tests/format \
	tests/unit/timer/test_compiled_rewrite.py tests/unit/timer/test_timer_codecs.py \
	tests/unit/schedule/test_schedule_codecs.py tests/unit/commitlog/test_record_values.py \
	tests/crash/test_kill_writer.py tests/unit/commitlog/test_read_map.py
ASAN_PYTEST_ARGS ?= -q

asan-build: $(STAMP)
	CC=$(ASAN_CC) MQSTORE_SANITIZE=1 MQSTORE_WERROR=$(MQSTORE_WERROR) $(BIN)/python setup.py -q build_ext \
		--build-lib $(ASAN_DIR)/lib --build-temp $(ASAN_DIR)/temp

test-asan: asan-build
	$(ASAN_ENV) $(BIN)/python -c "from mqstore.commitlog import _native; print('sanitizer build:', _native.__file__)"
	$(ASAN_ENV) $(BIN)/python -m pytest $(ASAN_PYTEST_ARGS) -p asan_check -p no:cacheprovider $(wildcard $(ASAN_TESTS))

# The Python-level harnesses (fuzz/: the put path, Message, the FlushGate, the codec bindings, finalizers, the timer's
# compiled link, each differential against the pure-Python codec, a model or invariants) under atheris, SECONDS
# seconds each, coverage-guided with the normal build (atheris's coverage of Python code; a preloaded ASan runtime
# would take over its coverage hooks), then every input of the corpus that grew is run again with the sanitizer
# build above. Corpora stay in $(FUZZ_DIR)/python/NAME/corpus; a failing input is written beside them (crash-*).
FUZZ_HARNESSES ?= put_path message_type flush_gate codec finalizers timer_link

fuzz-python: asan-build
	@for name in $(FUZZ_HARNESSES); do \
		out=$(FUZZ_DIR)/python/$$name; mkdir -p $$out/corpus && echo "fuzz-python: $$name, $(SECONDS) s" && \
		{ MQSTORE_NATIVE=1 $(BIN)/python -m fuzz.run $$name -max_total_time=$(SECONDS) -print_final_stats=1 \
			-artifact_prefix=$$out/ $$out/corpus > $$out/fuzz.log 2>&1 || { tail -40 $$out/fuzz.log; exit 1; }; } && \
		grep -E -e '^(stat::(number_of_executed_units|new_units_added)|FINDING)' $$out/fuzz.log; \
		echo "fuzz-python: $$name, its corpus with the sanitizer build" && \
		{ $(ASAN_ENV) $(BIN)/python -m fuzz.run $$name -runs=0 -artifact_prefix=$$out/ $$out/corpus \
			> $$out/replay.log 2>&1 || { tail -40 $$out/replay.log; exit 1; }; } && \
		grep -E -e '^#[0-9]+[[:space:]]+DONE' $$out/replay.log; \
	done
