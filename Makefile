# Idempotent entry points. `make demo` and `make test` set up everything they need first.
VENV      := .venv
BIN       := $(VENV)/bin
STAMP     := $(VENV)/.installed
DB        ?= accelharness.duckdb
OUT       ?= accelharness-results

WEB_STAMP := web/node_modules/.package-lock.json
SUDO      := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: setup browser demo test lint bench clean

setup: $(STAMP) $(WEB_STAMP) browser

# Debian's Chromium runs the browser half (never `playwright install`: it downloads, and fails offline);
# Xvfb gives `--headed` a display on a machine without one.
browser:
	@command -v chromium >/dev/null && command -v Xvfb >/dev/null || { $(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium xvfb; }

# onnxruntime-web from npm, served locally to the benchmark page (never from a CDN).
$(WEB_STAMP): web/package.json web/package-lock.json
	cd web && npm ci --no-audit --no-fund
	touch $(WEB_STAMP)

# torch==2.13.0 first: it is the CPU wheel on this machine's disk; any other spec pulls a
# multi-GB CUDA build. constraints.txt pins everything else to the versions CI ran with.
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -c constraints.txt -e '.[dev,jax,ray]'
	touch $(STAMP)

DEMO_MODELS ?= all-minilm-l6-v2,bert-tiny,gpt2-tiny,vit-tiny,wav2vec2-tiny,clip-tiny

# One run, native and browser side by side; then a prediction with its held-out error; the
# Markdown report printed; and last the self-contained HTML report.
demo: setup
	$(BIN)/accelharness run --model $(DEMO_MODELS) --batch-sizes 1,4 --sequence-lengths 32 \
		--hardware cpu,openvino --web-hardware wasm,webgpu,webnn --threads 1,2 --db $(DB) --output-dir $(OUT)
	$(BIN)/accelharness predict --model bert-base-uncased --batch-sizes 1,4 --sequence-lengths 32,128 --db $(DB)
	$(BIN)/accelharness report --run latest --db $(DB) --output-dir $(OUT) --format md,json,csv
	$(BIN)/accelharness report --run latest --db $(DB) --output-dir $(OUT) --format html

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint
	$(BIN)/pytest -q

bench: setup
	$(BIN)/python bench/native_overhead.py
	$(BIN)/python bench/web_overhead.py
	$(BIN)/python bench/suite_overhead.py

clean:
	rm -rf $(VENV) $(OUT) $(DB) $(DB).wal web/node_modules
