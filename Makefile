# Everything a new machine needs comes from here: a virtual environment with the project and its extras.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test install bench clean-demo fuzz-scan

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

bench: $(STAMP)
	$(BIN)/python bench/put_get.py

clean-demo:
	rm -rf demo-store

# The scan fuzzer (commitlog/csrc/fuzz/fuzz_scan.c, fuzz_index.c) over scan_core.c, arrow_core.c and index_core.c, with AddressSanitizer and UBSan, for
# SECONDS seconds, from seeds cut from real stores (make_seeds.py): libFuzzer when clang is there, else a
# standalone mutating driver built with gcc. A crash leaves its input in $(FUZZ_DIR)/crash-input.
SECONDS ?= 60
FUZZ_DIR ?= build/fuzz
FUZZ_PYTHON ?= $(BIN)/python
FUZZ_SOURCES := commitlog/csrc/fuzz/fuzz_scan.c commitlog/csrc/fuzz/fuzz_index.c commitlog/csrc/scan_core.c \
	commitlog/csrc/arrow_core.c commitlog/csrc/index_core.c commitlog/csrc/crc32.c
FUZZ_FLAGS := -g -O1 -fno-omit-frame-pointer -fno-sanitize-recover=all -I$$($(FUZZ_PYTHON) -c \
	"import sysconfig; print(sysconfig.get_paths()['include'])")

fuzz-scan:
	mkdir -p $(FUZZ_DIR)/seeds $(FUZZ_DIR)/corpus
	$(FUZZ_PYTHON) commitlog/csrc/fuzz/make_seeds.py $(FUZZ_DIR)/seeds
	if command -v clang >/dev/null; then \
		clang $(FUZZ_FLAGS) -fsanitize=fuzzer,address,undefined $(FUZZ_SOURCES) -lz -o $(FUZZ_DIR)/fuzz_scan && \
		cd $(FUZZ_DIR) && ./fuzz_scan -max_total_time=$(SECONDS) -artifact_prefix=./ corpus seeds; \
	else \
		gcc $(FUZZ_FLAGS) -fsanitize=address,undefined $(FUZZ_SOURCES) commitlog/csrc/fuzz/driver.c -lz \
			-o $(FUZZ_DIR)/fuzz_scan_driver && \
		cd $(FUZZ_DIR) && ./fuzz_scan_driver $(SECONDS) seeds/*; \
	fi
