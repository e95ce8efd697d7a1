#!/usr/bin/env bash
# `make test` with SKEWER_TEST_DOCKER=1, what .ci/run asks for (docs/compose.md#tests-on-docker):
# every test, the live path's integration tests and the compose stack on a Docker engine this run
# starts, the rest on the native services; then the engine is taken down with everything it
# started.
#
#   1. In the background, at the lowest CPU and I/O priority (what dockerd runs inherits it):
#      the Docker engine's own test (tests/integration/
#      test_docker_engine.py: Debian's docker.io installed the first time, the Compose plugin
#      fetched from PyPI, an engine of its own started, used and taken down without a trace),
#      alone, before any other engine runs; then `skewer services up docker` and
#      `skewer images build --local` (the Debian base, the stand-ins and skewer:local, with the
#      Kafka and Spark jars `make install` fetched). Cold, that is mostly downloads and the
#      images' package installs: in series with the tests it would not fit CI's budget.
#   2. Meanwhile, on the native services: every test but the live path's modules and the
#      Docker-backed ones (`-m "not live_path and not docker"`).
#   3. Then, on the engine: make's $(DOCKER_TESTS), as `make test-docker` runs them. The
#      live path's modules run once, on containers: the native services carry the live path
#      end to end in the demo, migration, cluster and fault tests of step 2, and running the
#      modules on both would cost CI the minutes it does not have (tests/service_backends.py).
#
# Exit status: non-zero when either pass fails or the engine and images could not be made (the
# last lines of their log are printed). At the end: each pass's time and the slowest test modules
# (tests/work_units.py). An engine that answered before is someone else's: the
# tests run on it and it is left alone (pipeline/services/docker_engine.py).
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
# Make's $(PYTEST_ARGS) and $(DOCKER_TESTS), split by the shell's rules as make's recipes split
# them (`make test` passes both).
eval "PYTEST_ARGS=(${PYTEST_ARGS:?run by make test})"
eval "DOCKER_TESTS=(${DOCKER_TESTS:?run by make test})"
RUN_DIR=${SKEWER_RUN_DIR:-.cache/run}
PREPARE_LOG=$RUN_DIR/docker-prepare.log
# The preparation gives way to the native pass's tests, which wait on their services.
LOWEST="nice -n 19 ionice -c 3"
# The native pass's output is kept: CI shows the tail of a run, where the Docker pass's summary
# would hide which native test failed, so that pass's short summary is printed again at the end.
NATIVE_LOG=$RUN_DIR/native-pass.log
mkdir -p "$RUN_DIR"
rm -rf .cache/test-durations # this run's passes only, for the report at the end

prepare_pid=""
native_status=0
finish() {
	local status=$?
	if ((native_status != 0)); then
		echo "run-with-docker: the native pass failed; its summary again (whole output: $NATIVE_LOG):" >&2
		sed -n '/short test summary info/,$p' "$NATIVE_LOG" >&2
	fi
	if [[ -n $prepare_pid ]] && kill -0 "$prepare_pid" 2>/dev/null; then
		kill -TERM -- "-$prepare_pid" 2>/dev/null || kill -TERM "$prepare_pid" 2>/dev/null
		wait "$prepare_pid" 2>/dev/null
	fi
	if ! $BIN/skewer services down docker; then
		echo "run-with-docker: the Docker engine did not stop cleanly" >&2
		status=1
	fi
	$BIN/python tests/work_units.py report || true
	exit "$status"
}
trap finish EXIT
trap 'exit 130' INT TERM

echo "run-with-docker: the Docker engine and the local images, in the background (log: $PREPARE_LOG)"
set -m # the preparation gets a process group of its own, which finish() can stop whole
(
	started=$(date +%s)
	SKEWER_TEST_DOCKER_ENGINE=1 SKEWER_TEST_BACKEND=native SKEWER_TEST_PASS=docker-engine \
		$LOWEST $BIN/pytest -p no:cacheprovider -q -rs --timeout=900 tests/integration/test_docker_engine.py &&
		$LOWEST $BIN/skewer services up docker &&
		$LOWEST $BIN/skewer images build --local
	status=$?
	echo "run-with-docker: engine and images ready in $(($(date +%s) - started)) s (exit $status)"
	exit $status
) >"$PREPARE_LOG" 2>&1 &
prepare_pid=$!
set +m

echo "run-with-docker: pass 1 of 2, the native services: every test but the live path's and Docker's"
SKEWER_TEST_BACKEND=native SKEWER_TEST_PASS=native \
	$BIN/pytest "${PYTEST_ARGS[@]}" -m "not live_path and not docker" 2>&1 |
	tee "$NATIVE_LOG"
native_status=${PIPESTATUS[0]}

wait "$prepare_pid"
prepare_status=$?
prepare_pid=""
tail -n 1 "$PREPARE_LOG"
if ((prepare_status != 0)); then
	echo "run-with-docker: the Docker engine or the local images could not be made; last lines of $PREPARE_LOG:" >&2
	tail -n 20 "$PREPARE_LOG" >&2
	exit 1
fi

echo "run-with-docker: pass 2 of 2, the Docker engine: the live path's tests on testcontainers, the compose stack"
SKEWER_TEST_BACKEND=docker SKEWER_TEST_IMAGES=local SKEWER_TEST_PASS=docker \
	$BIN/pytest "${PYTEST_ARGS[@]}" "${DOCKER_TESTS[@]}"
docker_status=$?

if ((native_status != 0 || docker_status != 0)); then
	echo "run-with-docker: native pass exit $native_status, Docker pass exit $docker_status" >&2
	exit 1
fi
