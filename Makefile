# The two commands of the README. Both install what they need first (scripts/bootstrap.sh).
VENV ?= .venv
BIN := $(VENV)/bin
export AIRFLOW_HOME ?= $(CURDIR)/.airflow_home
TEST_WORKERS ?= 5

.PHONY: bootstrap bootstrap-tests demo test lint typecheck unit bench

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

## The end-to-end tests mostly wait on nodes and subprocesses: files run side by side, a file's tests in order.
## The slowest files are named first so that they start first (pytest skips the paths it collected already).
SLOW_TESTS := tests/scheduler/test_deferral_race.py tests/deploy/test_celery_deployment.py tests/deploy/test_wide_jobs.py \
	tests/scheduler/test_real_scheduler.py \
	tests/cli/test_jobs_cli.py tests/cli/test_launch_cli.py tests/dags/test_recovery.py \
	tests/ssh/test_ssh_jobs.py tests/cli/test_autostop_cli.py tests/aws/test_aws_jobs.py tests/gcp/test_gcp_jobs.py
unit:
	$(BIN)/pytest -q --durations=15 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(SLOW_TESTS) tests

bench: bootstrap
	$(BIN)/python bench/run_all.py
