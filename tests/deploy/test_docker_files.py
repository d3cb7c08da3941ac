"""docker/ is consistent without a Docker engine: the compose file parses and wires what it names, the
Dockerfiles parse and copy files that exist, and the example DAG imports.

No image is built here (that needs the network); docs/deploy.md says how to run it for real.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from dockerfile_parse import DockerfileParser

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
AIRFLOW_COMPONENTS = {"api-server", "scheduler", "dag-processor", "triggerer", "worker"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def _dockerfile(path: Path) -> DockerfileParser:
    parser = DockerfileParser(fileobj=path.open("rb"))
    return parser


def test_compose_has_the_distributed_airflow_and_the_example_pool(compose):
    services = compose["services"]
    assert {"postgres", "redis", "keys", "node1", "node2", "airflow-init"} | AIRFLOW_COMPONENTS <= set(
        services
    )
    for name in AIRFLOW_COMPONENTS | {"airflow-init"}:
        env = services[name]["environment"]
        assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor", name
        assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg2://"), name
        assert env["AIRFLOW__CELERY__BROKER_URL"].startswith("redis://redis:"), name
        assert "airflow-logs:/opt/airflow/logs" in services[name]["volumes"], name  # logs shared by all
    for name in AIRFLOW_COMPONENTS:
        assert services[name]["depends_on"]["airflow-init"] == {"condition": "service_completed_successfully"}
    assert services["worker"]["command"] == "celery worker"


def test_every_service_dependency_volume_and_build_context_exists(compose):
    services = compose["services"]
    named_volumes = set(compose["volumes"])
    for name, service in services.items():
        for dependency in service.get("depends_on", {}):
            assert dependency in services, f"{name} depends on unknown service {dependency}"
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("."):
                assert (DOCKER / source).exists(), f"{name} mounts missing {source}"
            else:
                assert source in named_volumes, f"{name} mounts undeclared volume {source}"
        build = service.get("build")
        if build:
            context = (DOCKER / build["context"]).resolve()
            assert context == REPO and (context / build["dockerfile"]).is_file(), name
    images = {s.get("image") for s in services.values() if s.get("build")}
    users = [n for n, s in services.items() if s.get("image") in images and not s.get("build")]
    assert users == ["node1", "node2"]  # they run the image the keys service builds


def test_dockerfiles_start_from_airflow_3_3_and_copy_only_files_that_exist():
    airflow = _dockerfile(DOCKER / "Dockerfile")
    assert airflow.baseimage.startswith("apache/airflow:")
    assert "AIRFLOW_VERSION=3.3." in airflow.content
    node = _dockerfile(DOCKER / "node" / "Dockerfile")
    for parser in (airflow, node):
        for instruction in parser.structure:
            if instruction["instruction"] == "COPY":
                sources = [a for a in instruction["value"].split()[:-1] if not a.startswith("--")]
                for source in sources:
                    assert (REPO / source).exists(), f"COPY of missing {source}"
    assert "openssh-server" in node.content and "python3" in node.content and "rsync" in node.content


def test_the_node_scripts_are_valid_bash():
    for script in (DOCKER / "node").glob("*.sh"):
        check = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert check.returncode == 0, f"{script.name}: {check.stderr}"
        assert os.access(script, os.X_OK), f"{script.name} is not executable"


def test_the_key_script_writes_a_connection_that_airflow_sky_reads(tmp_path, monkeypatch):
    """make-keys.sh runs for real (ssh-keygen, python3) into a temp dir standing in for the keys volume."""
    script = (DOCKER / "node" / "make-keys.sh").read_text().replace("keys=/keys", f"keys={tmp_path}")
    script = script.replace(
        'chown 50000:0 "$keys/sky_pool.json"', ":"
    )  # the image's uid; not ours to take here
    run = subprocess.run(
        ["bash", "-c", script, "make-keys", "node1", "node2"], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    conn = json.loads((tmp_path / "sky_pool.json").read_text())
    assert (tmp_path / "sky_pool.json").stat().st_mode & 0o077 == 0  # the private key is in it

    from airflow_sky.infra.ssh.connection import pool_from_fields

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    pool = pool_from_fields(
        "docker-nodes",
        "sky_pool",
        host=conn["host"],
        login=conn["login"],
        password=None,
        port=conn["port"],
        extra=conn["extra"],
    )
    assert [(h.address, h.user, h.port) for h in pool.hosts] == [("node1", "sky", 22), ("node2", "sky", 22)]
    assert [line.split()[0] for line in pool.known_hosts] == ["node1", "node2"]


def test_the_example_dag_imports():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DOCKER / "dags"))
    assert bag.import_errors == {}
    dag = bag.dags["sky_hello"]
    assert {t.task_id.rsplit(".", 1)[-1] for t in dag.tasks} >= {"provision", "run_follow", "teardown"}
