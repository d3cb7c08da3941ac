"""A shared deployment's lanes for managed jobs, as pure rules: whose clusters a run conf may name, the name a
run's own cluster gets, what it may ask of the machines (ports, nodes, instance types, accelerators), and
the Airflow Variables its secrets live in."""

from __future__ import annotations

import hashlib
import itertools
import re
from typing import Any

import pytest

from airflow_sky.client.cluster_names import CLUSTER_NAME_PATTERN
from airflow_sky.errors import SpecError
from airflow_sky.gang.job import sanitize_cluster_name
from airflow_sky.operators.job_spec import JobSpec, secret_owner, secret_variable_key
from airflow_sky.task.cluster_namespace import (
    in_namespace,
    run_cluster_name,
    user_label,
    user_namespace,
)
from airflow_sky.task.conf_policy import ConfPolicy

OWNER = secret_owner("airflow_sky_jobs", "r")


def _policy(**settings: str) -> ConfPolicy:
    return ConfPolicy.from_settings(settings.get)


def _check(policy: ConfPolicy, task: dict[str, Any], user: str | None = "alice", **fields: Any) -> JobSpec:
    spec = JobSpec.from_conf({"task": task, "secrets": [], "infra": "aws", **fields}, owner=OWNER)
    spec.check_policy(policy, spec.load_task({}), user=user)
    return spec


# ---- clusters ----------------------------------------------------------------------------------------


def test_a_user_label_is_the_name_when_it_is_a_label_else_a_readable_part_and_a_hash():
    assert user_label("alice") == "alice" and user_label("bob-ops") == "bob-ops"
    for unclean in ("Bob.Smith", "bob_smith", "bob--smith", "dag_test", "7zip", "a" * 21, "ALICE", "é"):
        label = user_label(unclean)
        assert re.fullmatch(CLUSTER_NAME_PATTERN, label) and "--" not in label and len(label) <= 20, label
        assert label.endswith(hashlib.sha256(unclean.encode()).hexdigest()[:10])
    assert user_label("Bob.Smith") != user_label("bob_smith") != user_label("bob-smith")


def test_no_users_namespace_lies_inside_anothers():
    users = ["bob", "bob-ops", "bob-o", "b", "bo", "Bob", "bob_ops", "bob.ops", "dag_test", "dag-test"]
    for one, other in itertools.permutations(users, 2):
        prefix, theirs = user_namespace(one), user_namespace(other)
        assert prefix is not None and theirs is not None
        assert not theirs.startswith(prefix), (one, other)
        assert not in_namespace(f"{theirs}train", one), (one, other)


def test_run_cluster_names_carry_64_random_bits_no_run_id_and_lie_in_no_namespace():
    names = {run_cluster_name("airflow_sky_jobs") for _ in range(200)}
    assert len(names) == 200  # drawn, not derived: the same DAG (and any run id) never gives the same name
    for name in [*names, run_cluster_name("A" * 80, "job12"), run_cluster_name("9__x", "job2")]:
        assert re.fullmatch(CLUSTER_NAME_PATTERN, name) and len(name) <= 40, name
        assert sanitize_cluster_name(name) == name  # provision keeps it as it is
        assert "--" not in name and re.search(r"-[0-9a-f]{16}$", name), name
    assert run_cluster_name("airflow_sky_jobs", "job2").startswith("airflow-sky-jobs-job2-")


def test_by_default_a_conf_names_only_clusters_of_its_triggering_users_namespace():
    policy = ConfPolicy()
    assert _check(policy, {"run": "true"}, cluster_name="alice--dev").cluster_name == "alice--dev"
    with pytest.raises(SpecError) as refused:
        _check(policy, {"run": "true"}, cluster_name="bob--dev")
    message = str(refused.value)
    assert message.startswith("the run conf: cluster_name: bob--dev is not allowed here; ")
    assert "alice--<name> (the namespace of alice, who triggered the run)" in message
    assert "[sky] managed_cluster_names (AIRFLOW__SKY__MANAGED_CLUSTER_NAMES) is not set" in message
    assert "leave cluster_name out" in message and "\n" not in message
    # Another run's own cluster, named by a conf: it lies in no namespace.
    with pytest.raises(SpecError, match="cluster_name: airflow-sky-jobs-0123456789abcdef is not allowed"):
        _check(policy, {"run": "true"}, cluster_name="airflow-sky-jobs-0123456789abcdef")
    with pytest.raises(SpecError, match="the run has no triggering user, so no namespace of its own"):
        _check(policy, {"run": "true"}, user=None, cluster_name="alice--dev")
    # Spelled otherwise, it is judged as provision names it.
    with pytest.raises(SpecError, match="cluster_name: bob--dev is not allowed"):
        _check(policy, {"run": "true"}, cluster_name="Bob_-Dev")
    shared = _policy(managed_cluster_names="shared-*")
    assert _check(shared, {"run": "true"}, user=None, cluster_name="shared-a").cluster_name == "shared-a"


# ---- machines ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "task", "refusal"),
    [
        (
            {},
            {"resources": {"ports": [8888]}},
            r"task\.resources\.ports: 8888 is not allowed here; a run opens no port on this deployment "
            r"\(\[sky\] managed_ports \(AIRFLOW__SKY__MANAGED_PORTS\) is not set: .* or \* for any\)",
        ),
        (
            {"managed_ports": "8888, 6006-6010"},
            {"resources": {"ports": ["6006-6011"]}},
            r"task\.resources\.ports: 6006-6011 is not allowed here; allowed: 8888, 6006-6010 \(\[sky\] managed_ports",
        ),
        (
            {},
            {"num_nodes": 17},
            r"task\.num_nodes: 17 is more than this deployment allows; at most 16 \(\[sky\] managed_max_nodes "
            r"\(AIRFLOW__SKY__MANAGED_MAX_NODES\)\): ask for fewer",
        ),
        (
            {"managed_max_nodes": "4"},
            {"num_nodes": 5},
            r"task\.num_nodes: 5 is more than this deployment allows; at most 4",
        ),
        (
            {"managed_instance_types": "g5.*, n2-standard-*"},
            {"resources": {"any_of": [{"instance_type": "g5.xlarge"}, {"instance_type": "p5.48xlarge"}]}},
            r"task\.resources\.instance_type: p5\.48xlarge is not allowed here; allowed: g5\.\*, n2-standard-\* "
            r"\(\[sky\] managed_instance_types \(AIRFLOW__SKY__MANAGED_INSTANCE_TYPES\)\)",
        ),
        (
            {"managed_accelerators": "T4, L4"},
            {"resources": {"accelerators": ["L4:1", "H100:8"]}},
            r"task\.resources\.accelerators: H100 is not allowed here; allowed: T4, L4 "
            r"\(\[sky\] managed_accelerators \(AIRFLOW__SKY__MANAGED_ACCELERATORS\)\)",
        ),
    ],
)
def test_ports_nodes_instance_types_and_accelerators_are_refused_naming_field_value_and_setting(
    settings, task, refusal
):
    with pytest.raises(SpecError, match=rf"^the run conf: {refusal}"):
        _check(_policy(**settings), {"run": "true", **task})


def test_within_the_policy_a_task_asks_for_what_the_settings_list():
    policy = _policy(
        managed_ports="8888, 6006-6010",
        managed_max_nodes="4",
        managed_instance_types="g5.*",
        managed_accelerators="a10g, L4",
    )
    task = {
        "num_nodes": 4,
        "resources": {"ports": [8888, "6007-6009"], "instance_type": "g5.xlarge", "accelerators": "A10G:1"},
    }
    assert _check(policy, {"run": "true", **task}).infra == "aws"
    assert _check(ConfPolicy(), {"run": "true", "num_nodes": 16}).infra == "aws"  # the default cap
    anything = _policy(managed_ports="*")
    assert _check(anything, {"run": "true", "resources": {"ports": ["1-65535"]}}).infra == "aws"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"managed_ports": "80, http"},
            r"^\[sky\] managed_ports \(AIRFLOW__SKY__MANAGED_PORTS\): 'http' is no port",
        ),
        ({"managed_ports": "90-80"}, r"managed_ports .*'90-80' is no port"),
        ({"managed_max_nodes": "0"}, r"^\[sky\] managed_max_nodes .*'0' is no node count"),
        ({"managed_max_nodes": "many"}, r"managed_max_nodes .*'many' is no node count"),
    ],
)
def test_a_bad_machine_setting_is_one_line_naming_it(settings, message):
    with pytest.raises(SpecError, match=message):
        _policy(**settings)


# ---- secrets -----------------------------------------------------------------------------------------


def test_no_run_id_names_the_secret_variables_of_another_runs_job():
    # Before: pipeline job 2 of run R and a run named R-2 shared `airflow_sky_secret__R-2__TOKEN`.
    pipeline_job = secret_variable_key(secret_owner("airflow_sky_jobs", "R", 1), "TOKEN")
    for dag, run, index in [
        ("airflow_sky_jobs", "R-2", 0),
        ("airflow_sky_jobs", "R-1", 0),
        ("airflow_sky_jobs", "R", 0),
        ("team_b_jobs", "R", 1),  # the same run id in another managed DAG
        ("airflow_sky_jobs", "R__1", 0),
    ]:
        assert secret_variable_key(secret_owner(dag, run, index), "TOKEN") != pipeline_job, (dag, run, index)
    # A `__` in a run id or a name spells no other (owner, name): the owner is of fixed length.
    assert secret_variable_key(secret_owner("d", "r"), "A__B") != secret_variable_key(
        secret_owner("d", "r__A"), "B"
    )
    assert re.fullmatch(r"airflow_sky_secret__[0-9a-f]{32}__TOKEN", pipeline_job)  # "secret": masked
    with pytest.raises(ValueError):
        secret_variable_key("R-2", "TOKEN")  # an owner is a hash, never a run id
