"""The deployment's run conf policy (task.conf_policy): pure rules, and JobSpec.from_conf applying them."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_sky.errors import SpecError
from airflow_sky.operators.job_spec import JobSpec, secret_owner
from airflow_sky.task import Task
from airflow_sky.task.conf_policy import (
    ConfPolicy,
    bucket_allowed,
    cluster_allowed,
    infra_allowed,
    worker_paths,
)
from airflow_sky.task.storage import parse_bucket_uri

DEFAULT = ConfPolicy()
OWNER = secret_owner("airflow_sky_jobs", "r")


def _policy(**settings: str) -> ConfPolicy:
    return ConfPolicy.from_settings(settings.get, jobs_bucket=settings.get("jobs_bucket"))


def _conf(task: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    return {"task": task or {"run": "true"}, "secrets": [], **fields}


def _checked(conf: dict[str, Any], policy: ConfPolicy, secrets: dict[str, str] | None = None) -> JobSpec:
    """What the spec task does: the conf checked, its task loaded with the secrets' values, the policy."""
    spec = JobSpec.from_conf(conf, owner=OWNER)
    spec.check_policy(policy, spec.load_task(secrets or {}))
    return spec


@pytest.mark.parametrize("infra", ["aws", "aws/us-east-1", "gcp/us-central1", "ssh/gpu-pool"])
def test_by_default_every_infra_but_local_is_allowed(infra):
    assert infra_allowed(DEFAULT, infra)
    assert not infra_allowed(DEFAULT, "local")
    assert not infra_allowed(DEFAULT, " LOCAL ")


def test_local_is_allowed_only_when_the_deployment_names_it_a_glob_never_covers_it():
    assert infra_allowed(_policy(managed_infras="local"), "local")
    assert not infra_allowed(_policy(managed_infras="*"), "local")
    assert not infra_allowed(_policy(managed_infras="l*, loc?l"), "local")
    assert infra_allowed(_policy(managed_infras="*, local"), "local")


def test_an_infra_list_allows_its_names_what_is_below_them_and_glob_matches():
    policy = _policy(managed_infras="aws, ssh/gpu-pool gcp/us-*")
    for allowed in ("aws", "aws/eu-west-1", "AWS/us-east-1/us-east-1a", "ssh/gpu-pool", "gcp/us-east1"):
        assert infra_allowed(policy, allowed), allowed
    for refused in (
        "awsx",
        "ssh/other-pool",
        "ssh/gpu-pool2",
        "ssh/gpu-pool/../other-pool",
        "gcp/us-x/../../ssh/other",
        "aws/",
        "gcp",
        "gcp/europe-west4",
        "local",
    ):
        assert not infra_allowed(policy, refused), refused


def test_a_cluster_name_is_the_triggering_users_own_or_a_shared_one_the_default_shares_none():
    assert cluster_allowed(DEFAULT, "alice--dev", "alice")
    assert not cluster_allowed(DEFAULT, "anything-at-all", "alice")
    assert not cluster_allowed(DEFAULT, "bob--dev", "alice") and not cluster_allowed(
        DEFAULT, "alice--", "alice"
    )
    assert not cluster_allowed(DEFAULT, "alice--dev", None)  # a run nobody triggered has no namespace
    policy = _policy(managed_cluster_names="team-a-*, shared-dev")
    assert cluster_allowed(policy, "team-a-train", "bob") and cluster_allowed(policy, "shared-dev", None)
    assert not cluster_allowed(policy, "team-b-train", "bob") and not cluster_allowed(
        policy, "shared-dev2", "bob"
    )
    assert cluster_allowed(policy, "bob--x", "bob")  # the shared names add to the user's own


def test_a_bucket_allow_list_covers_its_buckets_and_prefixes_at_a_segment_boundary():
    policy = _policy(managed_buckets="s3://team-a-data, gs://shared/datasets/")
    assert policy.buckets == ("s3://team-a-data", "gs://shared/datasets")

    def allowed(uri: str, own: tuple[str, ...] = ()) -> bool:
        return bucket_allowed(policy, parse_bucket_uri("x", uri), own)

    assert allowed("s3://team-a-data") and allowed("s3://team-a-data/ckpt")
    assert allowed("gs://shared/datasets") and allowed("gs://shared/datasets/imagenet")
    assert not allowed("gs://shared") and not allowed("gs://shared/datasets-private")
    assert not allowed("s3://team-b-data") and not allowed("gs://team-a-data")
    assert not allowed("gs://shared/datasets/../secrets") and not allowed("gs://shared/datasets/./x")
    assert allowed("s3://jobs/uploads/run-1/workdir", own=("s3://jobs/uploads/run-1",))
    assert not bucket_allowed(DEFAULT, parse_bucket_uri("x", "s3://anything"))  # no list: none
    assert bucket_allowed(DEFAULT, parse_bucket_uri("x", "s3://jobs/run-1/x"), ("s3://jobs/run-1",))
    assert bucket_allowed(_policy(managed_buckets="*"), parse_bucket_uri("x", "s3://anything"))


def test_in_the_jobs_bucket_a_run_mounts_only_its_own_uploads():
    policy = _policy(jobs_bucket="s3://sky-jobs/uploads", managed_buckets="*")
    own = ("s3://sky-jobs/uploads/run-1",)
    for uri in ("s3://sky-jobs/uploads/run-2/workdir", "s3://sky-jobs/uploads", "s3://sky-jobs"):
        assert not bucket_allowed(policy, parse_bucket_uri("x", uri), own), uri
    assert bucket_allowed(policy, parse_bucket_uri("x", "s3://sky-jobs/uploads/run-1/workdir"), own)
    assert bucket_allowed(policy, parse_bucket_uri("x", "s3://sky-jobs/elsewhere"), own)
    assert bucket_allowed(policy, parse_bucket_uri("x", "s3://inputs/data"), own)


def test_a_bad_bucket_setting_is_one_line_naming_it():
    with pytest.raises(
        SpecError, match=r"^\[sky\] managed_buckets \(AIRFLOW__SKY__MANAGED_BUCKETS\): '/data'"
    ):
        _policy(managed_buckets="s3://fine-bucket, /data")


@pytest.mark.parametrize(
    ("task", "field"),
    [
        ({"workdir": "/home/airflow/project"}, "workdir"),
        ({"workdir": {"url": "/home/airflow/repo.git"}}, "workdir.url"),
        ({"workdir": {"url": "file:///home/airflow/repo.git"}}, "workdir.url"),
        ({"file_mounts": {"/tmp/k": "~/.airflow_sky/keys/id"}}, "file_mounts./tmp/k"),
        ({"file_mounts": {"/tmp/k": {"source": "/etc", "mode": "COPY"}}}, "file_mounts./tmp/k.source"),
        ({"file_mounts": {"/d": {"name": "b", "source": "~/x"}}}, "file_mounts./d.source"),
        ({"file_mounts": {"/d": {"source": ["s3://b/x", "/etc"]}}}, "file_mounts./d.source"),
        ({"file_mounts": {"/d": "$HOME/x"}}, "file_mounts./d"),
        ({"envs": {"GIT_SSH_KEY_PATH": "~/.ssh/id_rsa"}}, "envs.GIT_SSH_KEY_PATH"),
        ({"secrets": {"GIT_SSH_KEY_PATH": None}}, "secrets.GIT_SSH_KEY_PATH"),
    ],
)
def test_every_path_on_the_worker_is_found_and_from_conf_refuses_it_whatever_the_policy(task, field):
    assert [f.split(" ")[0] for f in worker_paths(task)] == [field]
    # Refused while the conf is read, before any policy is asked.
    with pytest.raises(SpecError, match=rf"^the run conf: task\.{field}\b.*path on the Airflow worker"):
        JobSpec.from_conf(_conf({**task, "run": "true"}), owner=OWNER)


@pytest.mark.parametrize(
    "task",
    [
        {"workdir": {"url": "https://github.com/org/repo", "ref": "main"}},
        {"workdir": {"url": "git@github.com:org/repo.git"}},
        {"workdir": {"url": "ssh://git@host/repo"}},
        {"file_mounts": {"/data": "s3://b/data", "/ckpt": {"name": "ckpt", "store": "s3"}}},
        {"file_mounts": {"/data": {"source": "gs://b/x", "mode": "MOUNT"}}},
        {"envs": {"OTHER": "/home/x"}},
    ],
)
def test_remote_sources_are_no_worker_paths(task):
    assert worker_paths(task) == []


def test_the_policy_judges_the_infra_the_resources_the_cluster_and_the_buckets():
    policy = _policy(managed_infras="aws", managed_cluster_names="team-a-*", managed_buckets="s3://team-a")
    ok = _conf({"run": "true", "file_mounts": {"/d": "s3://team-a/x"}}, infra="aws/us-east-1")
    assert _checked({**ok, "cluster_name": "team-a-1"}, policy).infra == "aws/us-east-1"
    refusals = [
        (_conf(infra="local"), r"infra: local is not allowed here; allowed: aws \(\[sky\] managed_infras"),
        ({**ok, "infra": "gcp"}, r"infra: gcp is not allowed here"),
        (
            _conf({"run": "true", "resources": {"infra": "gcp/us-central1"}}, infra="aws"),
            r"task\.resources\.infra: gcp/us-central1 is not allowed here",
        ),
        (
            {**ok, "cluster_name": "team-b-prod"},
            r"cluster_name: team-b-prod is not allowed here; .*team-a-\*",
        ),
        # Checked as provision names the cluster (sanitized): no way around a pattern by spelling.
        ({**ok, "cluster_name": "Team_B"}, r"cluster_name: team-b is not allowed here"),
        (
            _conf({"run": "true", "file_mounts": {"/d": {"name": "team-b"}}}, infra="aws"),
            r"task\.file_mounts\./d: bucket s3://team-b is not allowed here; allowed: s3://team-a",
        ),
    ]
    for conf, message in refusals:
        with pytest.raises(SpecError, match=rf"^the run conf: {message}"):
            _checked(conf, policy)


def test_the_default_policy_refuses_local_naming_the_setting_and_what_local_means():
    with pytest.raises(SpecError) as refused:
        _checked(_conf(), DEFAULT)  # infra: local, the conf's default
    message = str(refused.value)
    assert "\n" not in message
    assert "infra: local is not allowed here; every infra but local is" in message
    assert "AIRFLOW__SKY__MANAGED_INFRAS" in message and "runs on the worker itself" in message


def test_a_conf_from_jobs_launch_passes_the_policy_it_was_launched_under():
    task = Task(name="t", num_nodes=2, run="echo hi", file_mounts={"/d": "s3://team-a/d"})
    conf = JobSpec(task=task.to_dict(), secrets={}, infra="aws", cluster_name="team-a-x").to_run_conf()
    policy = _policy(managed_infras="aws", managed_cluster_names="team-a-*", managed_buckets="s3://team-a")
    assert _checked(conf, policy).cluster_name == "team-a-x"


def test_a_conf_mounting_another_runs_uploads_is_refused_even_without_an_allow_list():
    policy = _policy(jobs_bucket="s3://sky-jobs/uploads")
    mine = "s3://sky-jobs/uploads/run-1"
    task = {"run": "true", "file_mounts": {"~/x": "s3://sky-jobs/uploads/run-2/workdir"}}
    with pytest.raises(
        SpecError, match=r"file_mounts\.~/x: bucket s3://sky-jobs/uploads/run-2/workdir .* its own only"
    ):
        _checked(_conf(task, infra="aws", uploads=mine), policy)
    task["file_mounts"] = {"~/x": f"{mine}/workdir"}
    assert _checked(_conf(task, infra="aws", uploads=mine), policy).uploads == mine


def test_buckets_are_judged_with_the_secrets_values_the_nodes_will_mount():
    # A conf from `jobs launch` carries a secret as ${NAME}; with it empty the URI would look allowed.
    policy = _policy(managed_infras="aws", managed_buckets="s3://team-a")
    conf = {**_conf({"run": "true", "file_mounts": {"/d": "s3://team-a${SUFFIX}"}}, infra="aws")}
    conf["secrets"] = ["SUFFIX"]
    assert _checked(conf, policy, {"SUFFIX": "/data"}).infra == "aws"
    with pytest.raises(
        SpecError, match=r"task\.file_mounts\./d: bucket s3://team-a-other is not allowed here"
    ):
        _checked(conf, policy, {"SUFFIX": "-other"})


def test_a_whole_secret_as_a_source_is_judged_by_the_value_the_run_reads():
    # `jobs launch` sends `/data: $BUCKET` (BUCKET a secret) as ${BUCKET}: nothing to judge until the run
    # reads the secret's Variable, and a Variable holding a worker path is refused then.
    policy = _policy(managed_infras="aws", managed_buckets="s3://team-a")
    conf = _conf(
        {"run": "true", "file_mounts": {"/data": "${BUCKET}"}, "workdir": {"url": "${REPO}"}}, infra="aws"
    )
    conf["secrets"] = ["BUCKET", "REPO"]
    good = {"BUCKET": "s3://team-a/data", "REPO": "https://github.com/org/repo"}
    assert _checked(conf, policy, good).infra == "aws"
    with pytest.raises(SpecError, match=r"task\.file_mounts\./data \(.*path on the Airflow worker"):
        _checked(conf, policy, {**good, "BUCKET": "~/.airflow_sky/keys/id"})
    with pytest.raises(SpecError, match=r"task\.workdir\.url \(.*path on the Airflow worker"):
        _checked(conf, policy, {**good, "REPO": "/home/airflow/repo"})
    # A reference to something that is not a secret stays what it is: a path on the worker.
    with pytest.raises(SpecError, match=r"task\.file_mounts\./data"):
        JobSpec.from_conf({**conf, "secrets": ["REPO"]}, owner=OWNER)


def test_a_confs_cluster_name_is_the_name_the_cluster_gets_once_read():
    """A conf from the UI or the REST API never went through the CLI's normalization: the spec holds the
    name provision gives the cluster, which the policy judged."""
    policy = _policy(managed_infras="aws", managed_cluster_names="team-a-*")
    spec = _checked(_conf(infra="aws", cluster_name="Team_A_1"), policy)
    assert spec.cluster_name == "team-a-1"


def test_a_run_conf_may_name_a_container_image_but_never_add_docker_run_options():
    image = {"image_id": "docker:nvcr.io/nvidia/pytorch:24.10-py3"}
    assert _checked(_conf({"run": "true", "resources": image}, infra="aws"), DEFAULT).infra == "aws"
    hostile = {
        "run": "true",
        "resources": image,
        "config": {"docker": {"run_options": ["-v /:/host --privileged"]}},
    }
    with pytest.raises(SpecError) as refused:
        _checked(_conf(hostile, infra="aws"), DEFAULT)
    message = str(refused.value)
    assert message.startswith("the run conf: task.config.docker.run_options: a run conf cannot add")
    assert "-v /:/host --privileged" in message and "AIRFLOW__SKY__DOCKER_RUN_OPTIONS" in message
