.DEFAULT_GOAL := help
SHELL := /bin/bash
.PHONY: help setup demo airflow airflow-stop test test-fast lint bench bench-quick check clean reset

PY := .venv/bin/python
PYTEST_ARGS ?=
# Three pytest-xdist workers, whole modules each (module fixtures are built once), the longest handed out first
# (tests/conftest.py). On 2 cores a third worker fills the time the others wait on processes they started:
# 852 s against 931 s with two (docs/operations.md, The test suite). TEST_WORKERS=0 runs in this one process.
TEST_WORKERS ?= 3
XDIST := $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)
# Spark otherwise binds to whatever the hostname resolves to, which breaks in containers and CI.
export SPARK_LOCAL_IP ?= 127.0.0.1

help:  ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

setup:  ## check Java 17 / redis-server, build .venv and .venv-stream (no-op when up to date)
	@bash scripts/setup.sh

demo: setup  ## run the end-to-end demo
	$(PY) -m quiver.pipelines.demo

AIRFLOW_PORT ?= 8080
AIRFLOW_HOST ?= 127.0.0.1
airflow: setup  ## Airflow standalone (UI on $(AIRFLOW_HOST):$(AIRFLOW_PORT), the demo's runs in it); Ctrl-C stops it
	$(PY) -m quiver.pipelines.loop_airflow standalone $(AIRFLOW_PORT) . $(AIRFLOW_HOST)

airflow-stop:  ## stop `make airflow` (every process it started) from another terminal
	$(PY) -m quiver.pipelines.loop_airflow stop .

test: setup  ## run the whole test suite, every real part (extra args: PYTEST_ARGS="-k foo -x")
	$(PY) -m pytest tests --durations=25 $(XDIST) $(PYTEST_ARGS)

test-fast: setup  ## the inner loop: unit, golden and integration tests without Spark, Flink, Airflow, training, browser
	$(PY) -m pytest tests -m "not heavy" $(XDIST) $(PYTEST_ARGS)

lint: setup  ## ruff + mypy (strict, platform/quiver)
	.venv/bin/ruff check platform feature_defs pipelines monitoring dags benchmarks tests
	.venv/bin/mypy platform/quiver

# Scripts starting with "_" are shared helpers, not benchmarks.
BENCHES = $(filter-out benchmarks/_%,$(wildcard benchmarks/*.py))

# Every benchmark runs even when one misses its target or fails; the run fails at the end, naming them.
bench: setup  ## run every benchmark at full size
	@failed=""; for b in $(BENCHES); do echo "== $$b"; $(PY) $$b || failed="$$failed $$b"; done; \
	if [ -n "$$failed" ]; then echo "missed a target or failed:$$failed"; exit 1; fi

bench-quick: setup  ## the hot paths' quick benchmarks in one table: ratios, goals, the recorded baseline (< 10 min)
	$(PY) benchmarks/_table.py

check: lint test  ## lint + test

clean:  ## remove data/ and caches (keeps the venvs and .quiver/; `make reset` removes that too)
	rm -rf data .pytest_cache .mypy_cache .ruff_cache build dist
	find . -path ./.venv -prune -o -path ./.venv-stream -prune -o -path ./.venv-nannyml -prune -o -name __pycache__ -type d -print0 \
	  | xargs -0 rm -rf

reset: clean  ## clean, stop the embedded Redis and Kafka broker, delete .quiver/ (registry, online store, stream state)
	@if [ -x $(PY) ]; then $(PY) -m quiver.cli redis stop || true; $(PY) -m quiver.cli kafka stop || true; fi
	rm -rf .quiver
