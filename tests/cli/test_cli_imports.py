"""The CLI and SDK load without Airflow: the engine points Airflow at its private home before importing it;
the commands that only read or end a cluster (status, queue, an unknown cluster) never import it at all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_sky.infra.base import ProvisionRequest
from airflow_sky.infra.local.cloud import LocalCloud


def test_cli_and_sdk_modules_do_not_import_airflow_before_the_engine_configures_it() -> None:
    code = (
        "import sys, airflow_sky.client.cli, airflow_sky.client.sdk, airflow_sky.client.engine; "
        "[__import__(f'airflow_sky.client.cli.{m}') for m in ('check', 'launch', 'cluster_jobs', 'managed_jobs', 'local', 'progress', 'progress_view', 'progress_cells')]; "
        "loaded = [m for m in sys.modules if m == 'airflow' or m.startswith('airflow.')]; "
        "print(loaded[:5]); sys.exit(bool(loaded))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=Path(__file__).parents[2],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# Run in a child: the command's handler through main(), then which heavy modules it left loaded. Airflow,
# the cloud SDKs and torch take seconds to import; none of these commands needs them. (`google` and
# `google.cloud` themselves are namespace modules that site's .pth files create at every start.)
_HEAVY = ("airflow", "boto3", "botocore", "google.api_core", "google.auth", "google.cloud.storage", "torch")
_RUN_AND_REPORT = """
import json, sys
from airflow_sky.client.cli import main
code = main(sys.argv[1:])
heavy = sorted({m for m in sys.modules for h in HEAVY if m == h or m.startswith(h + ".")})
print("HEAVY=" + json.dumps(heavy))
sys.exit(code)
""".replace("HEAVY", repr(_HEAVY), 1)


def _cli_modules(*argv: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW_CONN_")}  # no cloud set up
    result = subprocess.run(
        [sys.executable, "-c", _RUN_AND_REPORT, *argv],
        cwd=Path(__file__).parents[2],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    reports = [line for line in result.stdout.splitlines() if line.startswith("HEAVY=")]
    assert reports, result.stdout + result.stderr
    return result, json.loads(reports[-1].removeprefix("HEAVY="))


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A real 1-node local cluster (its node server runs), with no job yet."""
    cloud = LocalCloud()
    cloud.provision(ProvisionRequest(cluster_name="no-airflow", num_nodes=1))
    try:
        yield "no-airflow"
    finally:
        cloud.terminate("no-airflow")


def test_status_and_queue_of_a_running_cluster_import_no_airflow(cluster: str) -> None:
    for argv in (["status"], ["status", cluster], ["queue", cluster]):
        result, heavy = _cli_modules(*argv)
        assert result.returncode == 0, result.stdout + result.stderr
        assert heavy == [], f"{argv}: {heavy}"
    assert cluster in _cli_modules("status")[0].stdout


def test_an_unknown_cluster_is_an_error_with_a_did_you_mean_and_imports_no_airflow(cluster: str) -> None:
    for argv in (["queue", "no-airflw"], ["logs", "no-airflw"], ["down", "no-airflw", "-y"]):
        result, heavy = _cli_modules(*argv)
        assert result.returncode == 1, result.stdout + result.stderr
        assert "cluster 'no-airflw' not found" in result.stderr
        assert "did you mean 'no-airflow'?" in result.stderr
        assert "Traceback" not in result.stderr
        assert heavy == [], f"{argv}: {heavy}"


def test_local_preempt_of_an_unknown_cluster_says_it_does_not_exist(cluster: str) -> None:
    result, heavy = _cli_modules("local", "preempt", "no-airflw", "0")
    assert result.returncode == 1
    assert "local cluster 'no-airflw' not found (local clusters: " in result.stderr
    assert "did you mean 'no-airflow'?" in result.stderr
    assert "ranks" not in result.stderr
    assert heavy == []
