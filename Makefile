# Every target does its own set-up, so each works on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed
export SQLD_IMAGE ?= harel-edge/sqld:0.24.32
# pytest-xdist workers for `make test` / `make test-local` (each worker starts its own sqld); 0 runs
# in this process. The sqld tests mostly wait (on servers, worker processes, paused primaries),
# so three workers keep two cores busy (docs/testing.md).
PYTEST_WORKERS ?= 3
# One line per test as it ends, with the run's percentage; the slowest tests at the end.
PYTEST_FLAGS   ?= -n $(PYTEST_WORKERS) --maxschedchunk=1 -v --durations=20

.PHONY: demo test test-local lint bench docker tools sqld-binary sqld-image up down clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

## The main job on the default local profile: two workers, a statechart and a workflow.
demo: $(STAMP)
	$(VENV)/bin/harel-edge demo

## The whole suite: installs and starts Docker, builds the sqld image, then runs every test.
test: $(STAMP) docker tools sqld-binary sqld-image
	$(PY) -m pytest $(PYTEST_FLAGS)

## Only what needs nothing but the package (no sqld).
test-local: $(STAMP)
	$(PY) -m pytest $(PYTEST_FLAGS) -m "not sqld and not chaos"

lint: $(STAMP)
	$(VENV)/bin/ruff check harel_edge tests benchmarks

## Every benchmark in turn (each prints its table; the sqld ones start their own sqld).
bench: $(STAMP) sqld-binary
	$(PY) benchmarks/bench_transport.py
	$(PY) benchmarks/bench_durable.py
	HAREL_EDGE_SQLD_BACKEND=binary $(PY) benchmarks/bench_claim_shapes.py
	HAREL_EDGE_SQLD_BACKEND=binary $(PY) benchmarks/bench_event_loop.py
	HAREL_EDGE_SQLD_BACKEND=binary $(PY) benchmarks/bench_sync_interval.py

docker:
	bash scripts/start-docker.sh

## tmux and Chromium, in which the tests run `status --watch` and the dashboard as a user would.
tools:
	@command -v tmux >/dev/null 2>&1 && command -v chromium >/dev/null 2>&1 || { apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends tmux chromium >/dev/null; }

sqld-binary:
	bash sqld/fetch-binary.sh

sqld-image: docker sqld-binary
	bash sqld/build-image.sh

up: $(STAMP) sqld-image
	bash compose/up.sh

down:
	bash compose/down.sh

clean:
	rm -rf $(VENV) .cache .pytest_cache .hypothesis
