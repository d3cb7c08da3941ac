# The two commands of the README. Both install what they need first (scripts/bootstrap.sh).
VENV ?= .venv
BIN := $(VENV)/bin
export AIRFLOW_HOME ?= $(CURDIR)/.airflow_home
TEST_WORKERS ?= 5

.PHONY: bootstrap bootstrap-tests demo test lint typecheck unit bench screenshots

bootstrap:
	@scripts/bootstrap.sh

bootstrap-tests:
	@scripts/bootstrap.sh --tests

## Runs the minGPT DDP demo: 2 nodes of the embedded local cluster, real torchrun training.
demo: bootstrap
	$(BIN)/airflow-sky launch -c mingpt-demo examples/mingpt/train.yaml --down -y

## Installs what the tests need, then runs ruff, mypy and the whole test suite.
test: bootstrap-tests lint typecheck unit

lint:
	$(BIN)/lint-imports --no-cache
	$(BIN)/ruff check airflow_sky tests dags examples bench docker
	$(BIN)/ruff format --check airflow_sky tests dags examples bench docker

typecheck:
	$(BIN)/mypy

## The end-to-end tests mostly wait on nodes and subprocesses: files run side by side, a file's tests in order;
## the slowest files start first (tests/conftest.py: SLOWEST_FILES; xdist would reorder them without the flag).
unit:
	$(BIN)/pytest -q --durations=15 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder tests

bench: bootstrap
	$(BIN)/python bench/run_all.py

## Refreshes the UI screenshots in docs/img: the grid and a rank's log from a real Celery deployment, the
## progress view on a minGPT job after a recovery from a real Airflow (the test suite writes no tracked files).
screenshots: bootstrap-tests
	AIRFLOW_SKY_DOCS_SCREENSHOTS=1 $(BIN)/pytest -q -p no:cacheprovider \
		"tests/deploy/test_celery_deployment.py::test_the_ui_renders_the_grid_and_a_rank_log_in_a_real_browser" \
		"tests/ui/test_progress_view_browser.py::test_a_preempted_rank_shows_as_a_recovery_and_every_rank_advances_again"
