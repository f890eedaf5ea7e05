# The two commands of the README. Each sets up what it needs first (scripts/setup.sh is idempotent).
#   make gates   the main job: the gate suite on the embedded local farm
#   make test    the project's own tests (what .ci/run calls)

PYTHON ?= python3

.PHONY: setup test lint gates

setup:
	@scripts/setup.sh

lint: setup
	$(PYTHON) -m ruff check src tests gates bench
	$(PYTHON) -m ruff format --check src tests gates bench

test: setup lint
	$(MAKE) -s -C engine test
	$(PYTHON) -m pytest tests --durations=30

gates: setup
	bmoe-ci farm up
	$(PYTHON) -m pytest gates --bmoe-device all -n 5  # one worker per device of the local farm
