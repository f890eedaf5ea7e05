# The two commands of the README. Each sets up what it needs first (scripts/setup.sh is idempotent).
#   make gates      the main job: the gate suite on the embedded local farm
#   make test       the project's own tests (what .ci/run calls)
#   make test-fast  the edit loop: lint, the host's engine tests, and the tests not marked slow

PYTHON ?= python3
# the project's tests run in this many pytest-xdist workers (each test's gate runs and engines are
# single-process, so two workers keep a two-core machine busy); TEST_WORKERS=0 runs them in one process
TEST_WORKERS ?= 2
# the fast subset's tests mostly wait (on engine processes, sockets, lease clocks): more workers than cores
FAST_WORKERS ?= 4

.PHONY: setup test test-fast lint gates

setup:
	@scripts/setup.sh

lint: setup
	$(PYTHON) -m ruff check src tests gates bench scripts
	$(PYTHON) -m ruff format --check src tests gates bench scripts
	$(PYTHON) -m mypy

test: setup lint
	$(MAKE) -s -j2 -C engine test
	$(PYTHON) -m pytest tests -n $(TEST_WORKERS) --durations=30

test-fast: setup lint
	$(MAKE) -s -j2 -C engine test
	$(PYTHON) -m pytest tests -n $(FAST_WORKERS) -m "not slow" -x

gates:
	@scripts/setup.sh gates  # all but the browser: only the report tests render in it
	bmoe-ci farm up
	$(PYTHON) -m pytest gates --bmoe-device all -n 5  # one worker per device of the local farm
