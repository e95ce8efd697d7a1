# skewer's two commands (README.md): `make demo` runs the main job on a fresh machine, `make test`
# runs every test. Both first run the installs, which are idempotent and quick when done:
#   - Debian packages: redis-server, prometheus, a Java 17 runtime, Maven (deploy/install-system.sh)
#   - .venv with the project and its pinned dependencies (again only when pyproject.toml changes)
#   - Kafka's jars and Spark's Kafka source from Maven Central into .cache/ (once)
SHELL := /bin/bash
.DEFAULT_GOAL := help

# The interpreter that creates .venv, looked up when needed (the system step may install it).
PYTHON ?= $$(command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.skewer-installed
DEMO_ARGS ?= --scheme pkg --records 100000 --verify
# A hung test must not eat CI's whole budget; the slowest tests are listed, to keep it short.
# Two pytest workers, a test file each at a time (module fixtures run once): most live tests
# wait on JVM starts, paced producers and closing windows, so two share two cores well. Test
# sessions side by side are safe by design: leases on the shared services, a Redis database
# per session, private services on random ports; `PYTEST_ARGS=...` runs one worker. The unit
# tests go first (they compile the kernels the live stages load), then the integration modules
# longest first, by tests/module_durations.json (`make test-durations` refreshes it from the last
# run); modules that must not run side by side go to one worker as a group (tests/work_units.py).
PYTEST_ARGS ?= --timeout=900 --durations=30 --numprocesses 2 --dist loadfile
# The Docker-backed tests (tests/service_backends.py says which and why), run by test-docker and
# by the Docker pass of `SKEWER_TEST_DOCKER=1 make test`.
DOCKER_TESTS := -m "live_path or docker" tests/integration tests/compose

.PHONY: help install system-packages python-env jars demo test test-docker test-durations up down status lint

help:
	@echo "make demo     install, start the native services, run the demo (skewer demo $(DEMO_ARGS))"
	@echo "make test     install, run every test (integration tests start the services they need"
	@echo "              and stop the ones they started)"
	@echo "SKEWER_TEST_DOCKER=1 make test  (what CI runs) also a Docker engine, the local images"
	@echo "              and the Docker-backed tests on them; the engine is stopped afterwards"
	@echo "make test-docker  the Docker-backed tests on the engine of DOCKER_HOST, local images"
	@echo "make install  only the installs;  make up | down | status  the native services"
	@echo "make test-durations  the last run's seconds per test module into tests/module_durations.json"
	@echo "docs         README.md first, then docs/index.md; skewer --help for every flag"

install: system-packages python-env jars

system-packages:
	@bash deploy/install-system.sh

python-env: system-packages $(INSTALLED)

$(INSTALLED): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $@

jars: python-env
	@$(BIN)/skewer services install

demo: install
	$(BIN)/skewer services up
	$(BIN)/skewer demo $(DEMO_ARGS)

# The test session's fixtures start the services integration tests need (native ones unless a
# Docker engine answers) and, even when tests fail, stop exactly the ones they started.
# SKEWER_TEST_DOCKER=1 (.ci/run sets it) also starts a Docker engine, builds the local images
# and runs the live path's tests and the compose stack on it (tests/run-with-docker.sh).
test: install
ifeq ($(SKEWER_TEST_DOCKER),1)
	PYTEST_ARGS='$(PYTEST_ARGS)' DOCKER_TESTS='$(DOCKER_TESTS)' bash tests/run-with-docker.sh
else
	$(BIN)/pytest $(PYTEST_ARGS)
endif

# The Docker-backed part of the tests (docs/compose.md#tests-on-docker) on the engine of
# DOCKER_HOST (`skewer services up docker` starts one and prints the line to export): the local
# images, built or reused, then the live path's integration tests on testcontainers with them,
# the Docker backend's own tests, compose's own check of the file and the stack end to end
# (tests/service_backends.py says which tests and why).
test-docker: install
	$(BIN)/skewer images build --local
	SKEWER_TEST_BACKEND=docker SKEWER_TEST_IMAGES=local $(BIN)/pytest $(PYTEST_ARGS) $(DOCKER_TESTS)

# The seconds each test module took in the last run, into the committed table the test session
# hands modules out by (tests/work_units.py).
test-durations: python-env
	$(BIN)/python tests/work_units.py refresh

up: install
	$(BIN)/skewer services up

down:
	@if [ -x $(BIN)/skewer ]; then $(BIN)/skewer services down; fi

status:
	$(BIN)/skewer services status

lint: python-env
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
