# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PG_URL ?= postgres://postgres@127.0.0.1:5432/durable_test
# pytest's cache (--lf) lives outside the project folder, one per checkout:
# a test run leaves nothing behind in the project.
PYTEST := $(PY) -m pytest -o cache_dir=$(or $(TMPDIR),/tmp)/durable-pytest-cache-$(shell printf %s "$(CURDIR)" | cksum | cut -d' ' -f1)
# The suite runs in parallel processes (pytest-xdist), one test database each;
# TEST_WORKERS=0 runs it in this process alone.
TEST_WORKERS ?= auto

.PHONY: install lint test test-postgres test-pooler test-system test-failover test-deep mutants demo migrate worker calendar simulator bench chaos clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[test]'
	touch $@

install: $(VENV)/.installed

lint: install  ## undefined and unused names, syntax errors
	$(VENV)/bin/ruff check .

# Tests marked `alone` run after the others, in one process: what they
# measure would be disturbed by other test processes on the same server.
# (pytest exits 5 when PYTEST_ARGS leaves none of them to run.)
SUITE = $(PYTEST) -n $(TEST_WORKERS) -m "not failover and not alone" $(PYTEST_ARGS) \
	&& { $(PYTEST) -m "alone and not failover" $(PYTEST_ARGS) || test $$? -eq 5; }

test: install  ## the suite, on DATABASE_URL (default: SQLite), in TEST_WORKERS processes
	$(SUITE)

test-postgres: install  ## the suite on the local PostgreSQL
	DATABASE_URL=$(PG_URL) $(SUITE)

test-pooler: install  ## the worker, claim, chaos and NOTIFY tests through a private PgBouncer in transaction mode (.ci/pooler; needs root for apt-get/runuser)
	VENV=$(VENV) .ci/pooler

test-system: install  ## the system test (DESIGN §19) alone, on DATABASE_URL (default: SQLite); SYSTEM_TEST_RULES picks rule groups
	$(PYTEST) tests/test_system.py $(PYTEST_ARGS)

test-deep: install  ## the Store state machine and the system test, explored far longer (hypothesis profile "deep")
	HYPOTHESIS_PROFILE=deep $(PYTEST) tests/jobs/test_state_machine.py tests/test_system.py $(PYTEST_ARGS)

mutants: install  ## curated one-line mutants of the rules that matter; fails if one survives (SQLite; SKIP LOCKED on PG_URL)
	MUTANTS_POSTGRES_URL=$${MUTANTS_POSTGRES_URL:-$(PG_URL)_mutants} $(PY) tools/mutants.py $(MUTANTS_ARGS)

migrate: install
	$(PY) manage.py migrate --noinput

demo: migrate  ## the company story (seed, simulator, SIGKILL after acceptance, replies, timers), then the admin with a worker behind it; DEMO_SERVE=0 skips serving
	$(PY) manage.py demo

worker: install
	$(PY) manage.py run_worker

calendar: migrate  ## django-q2 as the calendar: install the default schedules, then run them (qcluster)
	$(PY) manage.py install_schedules
	$(PY) manage.py qcluster

bench: install  ## speed figures on DATABASE_URL (see docs/benchmarks.md)
	$(PY) manage.py bench $(BENCH_ARGS)

chaos: install  ## kill workers at random while emails go through the simulator
	$(PY) manage.py chaos $(CHAOS_ARGS)

simulator: install  ## the provider simulator on :8025
	$(PY) manage.py run_provider_simulator $(SIMULATOR_ARGS)

clean:
	rm -rf $(VENV) db.sqlite3* test_db.sqlite3* var/

test-failover: install  ## private clusters: the primary crashed under running workers, its standby promoted (FAILOVER_ROUNDS, FAILOVER_SYNCHRONOUS=1); needs PostgreSQL's server binaries and root or user postgres
	DATABASE_URL=$(PG_URL) $(PYTEST) -m failover -s tests/proving/test_failover_pg.py $(PYTEST_ARGS)
