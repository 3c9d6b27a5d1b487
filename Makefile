# Idempotent entry points. `make demo` and `make test` set up everything they need first.
VENV      := .venv
BIN       := $(VENV)/bin
STAMP     := $(VENV)/.installed
DB        ?= accelharness.duckdb
OUT       ?= accelharness-results

.PHONY: setup demo test lint bench clean

setup: $(STAMP)

# torch==2.13.0 first: it is the CPU wheel on this machine's disk; any other spec pulls a
# multi-GB CUDA build. constraints.txt pins everything else to the versions CI ran with.
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

demo: setup
	$(BIN)/accelharness native --small-models --batch-sizes 1,4 --sequence-lengths 32 \
		--hardware cpu,openvino --db $(DB) --output-dir $(OUT)
	$(BIN)/accelharness report --run latest --db $(DB) --output-dir $(OUT) --format md,json,csv

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint
	$(BIN)/pytest -q

bench: setup
	$(BIN)/python bench/native_overhead.py

clean:
	rm -rf $(VENV) $(OUT) $(DB) $(DB).wal
