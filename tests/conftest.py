"""Test-wide setup: every test run keeps its local-cluster state and Airflow home in a private tmp dir."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from airflow_sky.infra.base import Node, ProvisionRequest
from airflow_sky.infra.local import daemon, layout
from airflow_sky.infra.local.cloud import LocalCloud

REPO_ROOT = Path(__file__).resolve().parent.parent

# The end-to-end files that run longest, longest first. They are collected first, so that under
# `pytest-xdist --dist loadfile --no-loadscope-reorder` (`make test`) each starts on a worker at once
# instead of ending the run alone. Collection otherwise follows the directory tree, whatever the order of
# the paths on the command line.
SLOWEST_FILES = (
    # xdist hands each of the 5 workers two files at first, in this order: files 1-5 start at once and 6-10
    # follow on the same workers. The Airflow stacks (celery, deferral race, wide, real scheduler, abandoned)
    # are spread so that no more than two run at a time on a 2-core machine.
    "tests/deploy/test_celery_deployment.py",
    "tests/scheduler/test_deferral_race.py",
    "tests/cli/test_jobs_cli.py",
    "tests/cli/test_launch_cli.py",
    "tests/dags/test_recovery.py",
    # Builds its images once per machine (debootstrap, PyTorch) and pushes a GB to a registry: early.
    "tests/containers/test_container_jobs.py",
    "tests/dags/test_bucket_mounts.py",
    "tests/cli/test_autostop_cli.py",
    "tests/aws/test_aws_jobs.py",
    "tests/deploy/test_wide_jobs.py",
    "tests/scheduler/test_real_scheduler.py",
    "tests/ui/test_progress_view_browser.py",
    "tests/gcp/test_gcp_jobs.py",
    "tests/deploy/test_abandoned_run.py",
    "tests/scheduler/test_managed_jobs.py",
    "tests/ssh/test_ssh_jobs.py",
    "tests/dags/test_sky_job_dag.py",
    "tests/cli/test_first_user.py",
    "tests/dags/test_pipelines.py",
    "tests/scheduler/test_shared_cluster.py",
    "tests/ui/test_progress_api.py",  # an API server, two jobs and Chromium: ~105 s on an idle machine
    "tests/dags/test_progress_dag.py",  # three `airflow dags test` runs: ~110 s
    "tests/dags/test_sweep_on_pool.py",  # two pools, two sweeps under `airflow dags test`: ~85 s
    "tests/cli/test_progress_cli.py",  # a kept 2-node cluster, two launches: ~115 s on a loaded machine
    "tests/cli/test_sky_launch_forms.py",  # a kept cluster, four launches/execs: ~140 s on a loaded machine
    "tests/cli/test_sky_cluster_forms.py",  # ~75 s
    "tests/docs/test_guide_samples.py",  # the guide's minGPT launch: ~50 s
    "tests/ui/test_fleet_view_browser.py",  # an Airflow stack, sshd hosts, moto, three jobs, Chromium: ~85 s
    # Last of the slow ones: started once the first waves of stacks are over (with them, the machine was loaded
    # enough for jobs_cli's exec waits and the wide job's sshd hosts to time out).
    "tests/ui/test_sweep_view_browser.py",  # an Airflow stack, a minGPT sweep on a pool, Chromium: ~2 min idle
    "tests/ssh/test_pool_workers.py",  # a pool of ssh hosts and a sweep on it: ~90 s
)

# Set before any test module imports Airflow: nothing may write to ~/airflow or ~/.airflow_sky.
_STATE = Path(tempfile.mkdtemp(prefix="airflow-sky-tests-"))
os.environ[layout.ROOT_ENV] = str(_STATE / "local")
# Cloud nodes' notice watchers (infra.notices) ask a port where nothing listens, never a real metadata service
# (the machine running the tests may be a cloud VM); tests that give notices point them at a stand-in.
os.environ["AIRFLOW__SKY__METADATA_URL"] = "http://127.0.0.1:9"
# Local nodes run in their own mount namespace (as root in CI), where /tmp is each node's own: the tests'
# probe dirs (tmp_path), through which node scripts report to the test, must lie outside it, as a real
# cluster's shared storage would. pytest reads this when it first creates a tmp_path.
os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", "/var/tmp")
# Node homes: short, and outside /tmp (which a node in its own mount namespace sees replaced).
_HOMES = Path(tempfile.mkdtemp(prefix="sky-tests-", dir="/var/tmp"))
os.environ[layout.HOMES_ENV] = str(_HOMES)
os.environ["AIRFLOW_SKY_AIRFLOW_HOME"] = str(_STATE / "cli-airflow")
os.environ["AIRFLOW_SKY_HOME"] = str(_STATE / "sky-home")  # clusters.json, ssh entries
os.environ["AIRFLOW_SKY_SSH_CONFIG"] = str(_STATE / "ssh_config")  # never the user's ~/.ssh/config
# pytest-xdist workers run side by side: each gets its own Airflow DB, and its local nodes their own SSH
# port (the loopback address allocator only sees its own worker's nodes).
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
os.environ["AIRFLOW_HOME"] = str(REPO_ROOT / ".airflow_home" / f"tests{_WORKER}")
if _WORKER:
    os.environ[layout.DEFAULT_SSH_PORT_ENV] = str(
        layout.DEFAULT_SSH_PORT + 1 + int(_WORKER.removeprefix("gw"))
    )
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"


@pytest.fixture(scope="session", autouse=True)
def _quiet_paramiko() -> Iterator[None]:
    logging.getLogger("paramiko").setLevel(logging.WARNING)
    yield
    shutil.rmtree(_STATE, ignore_errors=True)
    shutil.rmtree(_HOMES, ignore_errors=True)


@pytest.fixture
def local_cluster(request: pytest.FixtureRequest) -> Iterator[Callable[[int], tuple[str, list[Node], str]]]:
    """Factory: bring up an N-node local cluster; tears it down and checks no process is left behind."""
    cloud = LocalCloud()
    names: list[str] = []

    def make(num_nodes: int) -> tuple[str, list[Node], str]:
        name = f"t-{request.node.name[:30].replace('[', '-').replace(']', '').replace('_', '-')}-{len(names)}"
        names.append(name)
        nodes = cloud.provision(ProvisionRequest(cluster_name=name, num_nodes=num_nodes))
        return name, nodes, cloud.ssh_private_key(name)

    yield make
    for name in names:
        cloud.terminate(name)
        assert daemon.processes_with_marker(name) == [], f"processes of cluster {name} left behind"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The slowest files first (SLOWEST_FILES), every other test in its collected order."""
    rank = {path: i for i, path in enumerate(SLOWEST_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))
