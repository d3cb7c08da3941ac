"""The managed jobs DAG runs whatever task its run conf carries (real local nodes, `airflow dags test`)."""

from __future__ import annotations

import re
import subprocess

import pytest

from airflow_sky import Task
from airflow_sky.infra.local import daemon
from airflow_sky.operators.job_spec import JobSpec, secret_owner, secret_variable_key
from airflow_sky.task.cluster_namespace import user_namespace
from tests.dags.conftest import AIRFLOW

SOURCE = """
from airflow_sky.dags.managed import managed_jobs_dag

dag = managed_jobs_dag()
"""
SECRET = "s3cr3t-managed-token"
# These runs use the local infra: the deployment opts in (by default a run conf may not name it).
LOCAL_ALLOWED = {"AIRFLOW__SKY__MANAGED_INFRAS": "local"}
# `airflow dags test` triggers its run as the user `dag_test`: the clusters it may name are in its namespace.
MINE = f"{user_namespace('dag_test')}"
# What `airflow-sky jobs launch` does before it triggers a run: the secret into the run's Variable (here from
# a task of the run: `airflow dags test` names the run itself).
PLANTED_SOURCE = (
    SOURCE
    + """
import os

from airflow.sdk import Variable, task

from airflow_sky.operators.job_spec import secret_owner, secret_variable_key


@task
def plant(run_id=None):
    Variable.set(secret_variable_key(secret_owner(dag.dag_id, run_id), "TOKEN"), os.environ["PLANT_SECRET"])


with dag:
    plant() >> dag.get_task("spec")
"""
)


def _variables(airflow_home: dict[str, str]) -> str:
    listed = subprocess.run(
        [AIRFLOW, "variables", "list", "-o", "plain"], env=airflow_home, capture_output=True, text=True
    )
    return listed.stdout


def test_the_managed_dag_runs_the_task_of_its_conf_with_secrets_from_variables_and_forgets_them(
    run_dag, airflow_home, tmp_path
):
    task = Task(
        name="managed",
        num_nodes=2,
        envs={"PROBE": str(tmp_path)},
        secrets={"TOKEN": SECRET},
        run='echo "rank $SKYPILOT_NODE_RANK of $SKYPILOT_NUM_NODES token=$TOKEN" > "$PROBE/ran-$SKYPILOT_NODE_RANK";'
        ' echo "{{ not jinja }} token=$TOKEN"',
    )
    mapping = task.to_dict()
    mapping["secrets"] = {"TOKEN": None}
    cluster = f"{MINE}managed"  # in the namespace of the user who triggers the run: allowed by default
    conf = JobSpec(task=mapping, secrets={"TOKEN": ""}, cluster_name=cluster).to_run_conf()
    assert conf["secrets"] == ["TOKEN"]  # names only: the value never enters a conf
    result = run_dag(
        "airflow_sky_jobs", PLANTED_SOURCE, conf=conf, env={**LOCAL_ALLOWED, "PLANT_SECRET": SECRET}
    )
    assert result.returncode == 0, result.digest
    for rank in range(2):
        assert (tmp_path / f"ran-{rank}").read_text() == f"rank {rank} of 2 token={SECRET}\n"
    assert "{{ not jinja }} token=***" in result.output  # the script is never rendered; the secret masked
    assert SECRET not in result.output
    assert "airflow_sky_secret__" not in _variables(airflow_home)  # forget_secrets deleted it
    assert f"Launching cluster {cluster} on local" in result.output
    assert daemon.processes_with_marker(cluster) == []


def test_a_bad_conf_fails_the_spec_task_before_any_node_exists_and_its_secrets_are_forgotten(
    run_dag, airflow_home
):
    conf = {"task": {"run": "true", "num_nodes": "two"}, "secrets": ["TOKEN"]}
    result = run_dag(
        "airflow_sky_jobs", PLANTED_SOURCE, conf=conf, env={**LOCAL_ALLOWED, "PLANT_SECRET": SECRET}
    )
    assert result.returncode != 0
    assert "num_nodes" in result.output and "[DAG TEST] starting task_id=job.provision" not in result.output
    assert "airflow_sky_secret__" not in _variables(airflow_home)  # the teardown ran all the same


def test_a_conf_cannot_name_the_variable_of_another_runs_secret(run_dag, airflow_home):
    foreign = secret_variable_key(secret_owner("airflow_sky_jobs", "sky-job-of-someone-else"), "TOKEN")
    subprocess.run(
        [AIRFLOW, "variables", "set", foreign, SECRET], env=airflow_home, check=True, capture_output=True
    )
    conf = {"task": Task(run="echo $TOKEN").to_dict(), "secrets": {"TOKEN": foreign}}
    result = run_dag("airflow_sky_jobs", SOURCE, conf=conf, env=LOCAL_ALLOWED)
    assert result.returncode != 0
    assert "secrets: must list the secrets' names" in result.output
    assert SECRET not in result.output
    assert foreign in _variables(airflow_home)  # forget_secrets left it alone


PIPELINE_SOURCE = """
from airflow_sky.dags.managed import managed_jobs_dag

dag = managed_jobs_dag(pipeline_slots=3)
"""


def _pipeline_conf(tmp_path, first_run: str) -> dict[str, object]:
    first = Task(name="prepare", envs={"PROBE": str(tmp_path)}, run=first_run)
    second = Task(
        name="train",
        num_nodes=2,
        envs={"PROBE": str(tmp_path)},
        run='test -f "$PROBE/prepared" && echo "$SKYPILOT_NODE_RANK" >> "$PROBE/trained"',
    )
    return {
        "pipeline": "prep-train",
        "jobs": [JobSpec(task=t.to_dict(), secrets={}).to_run_conf() for t in (first, second)],
    }


def test_a_pipeline_conf_runs_its_jobs_in_order_each_on_its_own_cluster_and_skips_unused_slots(
    run_dag, tmp_path
):
    result = run_dag(
        "airflow_sky_jobs",
        PIPELINE_SOURCE,
        conf=_pipeline_conf(tmp_path, 'touch "$PROBE/prepared"'),
        env=LOCAL_ALLOWED,
    )
    assert result.returncode == 0, result.digest
    assert sorted((tmp_path / "trained").read_text().split()) == ["0", "1"]
    assert "job3.provision" not in result.output.split("[DAG TEST] starting task_id=")[-1]  # slot 3 unused
    assert "slot 3 is not used" in result.output
    clusters = set(re.findall(r"(?:Launching|Reusing) cluster (\S+) on", result.output))
    assert len(clusters) == 2, clusters  # one per job
    for cluster in clusters:  # named with 64 random bits, not after the run id
        assert re.fullmatch(r"airflow-sky-jobs-job[12]-[0-9a-f]{16}", cluster), clusters
    for cluster in clusters:
        assert daemon.processes_with_marker(cluster) == []


def test_a_failed_pipeline_job_stops_the_jobs_after_it(run_dag, tmp_path):
    result = run_dag(
        "airflow_sky_jobs", PIPELINE_SOURCE, conf=_pipeline_conf(tmp_path, "exit 7"), env=LOCAL_ALLOWED
    )
    assert result.returncode != 0
    assert "rank 0 failed with exit code 7" in result.output
    assert not (tmp_path / "trained").exists()
    assert "[DAG TEST] starting task_id=job2.provision" not in result.output


@pytest.mark.parametrize(
    ("settings", "hostile", "refusal"),
    [
        # The worker's own key as a file_mount, on a deployment that allows everything: never.
        (
            {"AIRFLOW__SKY__MANAGED_INFRAS": "*, local"},
            {"file_mounts": {"/tmp/k": "{key}"}},
            "the run conf: task.file_mounts./tmp/k ({key}): names a path on the Airflow worker",
        ),
        # The default policy: `local` (the worker host itself) is not for a run conf.
        ({}, {}, "the run conf: infra: local is not allowed here; every infra but local is"),
    ],
)
def test_a_hostile_conf_fails_the_spec_task_with_the_policys_line_before_any_node(
    run_dag, tmp_path, settings, hostile, refusal
):
    key = tmp_path / "id_worker"
    key.write_text("WORKER-PRIVATE-KEY-MARKER\n")
    fields = {k: {d: s.format(key=key) for d, s in v.items()} for k, v in hostile.items()}
    task = {"run": "cat /tmp/k; echo ran > " + str(tmp_path / "ran"), **fields}
    conf = {"task": task, "secrets": [], "infra": "local", "cluster_name": "hostile-c"}

    result = run_dag("airflow_sky_jobs", SOURCE, conf=conf, env=settings)

    assert result.returncode != 0
    assert refusal.format(key=key) in result.output, result.digest
    assert "[DAG TEST] starting task_id=job.provision" not in result.output
    assert "WORKER-PRIVATE-KEY-MARKER" not in result.output and not (tmp_path / "ran").exists()
    assert daemon.processes_with_marker("hostile-c") == []


# A run of another managed DAG, whose run id a trigger-only user copies: its secrets' Variables (the single
# job's, and a pipeline's first and second job's). Planted by a task of the copying run itself, which knows
# the run id (`airflow dags test` names the run).
FOREIGN_SOURCE = (
    SOURCE
    + """
import os

from airflow.sdk import Variable, task

from airflow_sky.operators.job_spec import secret_owner, secret_variable_key


@task
def plant(run_id=None):
    keys = [secret_variable_key(secret_owner("team_a_jobs", run_id, index), "TOKEN") for index in (0, 1)]
    for key in keys:
        Variable.set(key, os.environ["PLANT_SECRET"])
    with open(os.environ["PLANT_KEYS"], "w") as planted:
        planted.write(" ".join(keys))


with dag:
    plant() >> dag.get_task("spec")
"""
)


def test_a_run_id_copied_from_another_managed_dags_run_neither_reads_nor_deletes_its_secrets(
    run_dag, airflow_home, tmp_path
):
    # Before: a job's Variables were named by its run id alone (`<run id>` or `<run id>-<n>`), so a run of
    # another DAG with the same id, or a run named `R-2` next to pipeline run `R`, read and deleted them.
    conf = {"task": {"run": f'echo "token=$TOKEN" > {tmp_path}/leak'}, "secrets": ["TOKEN"], "infra": "local"}
    keys = tmp_path / "planted"
    env = {**LOCAL_ALLOWED, "PLANT_SECRET": SECRET, "PLANT_KEYS": str(keys)}
    result = run_dag("airflow_sky_jobs", FOREIGN_SOURCE, conf=conf, env=env)
    assert result.returncode != 0
    assert "secrets.TOKEN: the Airflow Variable airflow_sky_secret__" in result.output, result.digest
    assert "is gone" in result.output and not (tmp_path / "leak").exists()
    assert SECRET not in result.output
    left = _variables(airflow_home)
    planted = keys.read_text().split()
    assert len(planted) == 2
    for key in planted:  # forget_secrets deleted only what was its own
        assert key in left, (key, left)
        subprocess.run(
            [AIRFLOW, "variables", "delete", key], env=airflow_home, check=True, capture_output=True
        )


def test_a_conf_naming_another_users_cluster_fails_the_spec_task_before_any_node(run_dag, tmp_path):
    conf = {
        "task": {"run": f"echo ran > {tmp_path}/ran"},
        "secrets": [],
        "infra": "local",
        "cluster_name": "alice--train",
    }
    result = run_dag("airflow_sky_jobs", SOURCE, conf=conf, env=LOCAL_ALLOWED)
    assert result.returncode != 0
    assert (
        "the run conf: cluster_name: alice--train is not allowed here; name a cluster of your own, "
        f"{MINE}<name> (the namespace of dag_test, who triggered the run)"
    ) in result.output, result.digest
    assert "[DAG TEST] starting task_id=job.provision" not in result.output
    assert not (tmp_path / "ran").exists() and daemon.processes_with_marker("alice--train") == []
