"""Files a job can reach on its node (its result, exit code, pid, log, artifacts) are read bounded in bytes
and time: a job that links them to /dev/zero or makes them FIFOs gets a clear error quickly, in the worker's
follow and in the triggerer's, and never a read that runs forever."""

from __future__ import annotations

import asyncio
import time

import pytest

from airflow_sky import Task
from airflow_sky.errors import JobFailed
from airflow_sky.gang.follow import Wake
from airflow_sky.gang.gang_job import GangJob
from airflow_sky.gang.phases import read_result, register_job, start_rank
from airflow_sky.infra.registry import open_cluster
from airflow_sky.node import jobs
from airflow_sky.node.artifacts import upload_artifacts
from airflow_sky.node.client import NodeClient, UnsafeRemoteFile
from airflow_sky.triggers import SkyFollowTrigger

# How a job plants each kind of hostile file: a link to an endless device, or a FIFO nobody writes.
PLANT = {"devzero": 'ln -sfn /dev/zero "$1"', "fifo": 'rm -f "$1"; mkfifo "$1"'}
ERROR = {"devzero": "is a symlink, not a regular file", "fifo": "is a FIFO, not a regular file"}


def _hostile_run(kind: str, seconds: int) -> str:
    """Plant the files, say so, keep running a while (the followers read them meanwhile), then exit 0."""
    return (
        f"plant() {{ {PLANT[kind]}; }}; "
        'gen="$AIRFLOW_SKY_JOB_DIR/gen-0"; '
        'plant "$AIRFLOW_SKY_XCOM_DIR/return.json"; plant "$gen/exit_code"; plant "$HOME/artifact.bin"; '
        f'echo planted; sleep {seconds}; echo "bye"'
    )


def _job(local_cluster, run: str):
    name, nodes, _ = local_cluster(1)
    cluster = open_cluster(name, "local")
    task = Task(name="hostile", num_nodes=1, run=run)
    handle = register_job(cluster, task, nodes, submit_key="test")
    assert start_rank(cluster, task, handle, "run", 0).started
    return cluster, handle, nodes[0]


def _wait_planted(client: NodeClient, job_id: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if b"planted" in jobs.read_job(client, job_id, 0, 0).data:
            return
        time.sleep(0.1)
    raise AssertionError("the job did not plant its files")


@pytest.mark.parametrize("kind", ["devzero", "fifo"])
def test_a_job_that_links_its_result_and_exit_code_to_dev_zero_or_a_fifo_fails_clearly_and_quickly(
    local_cluster, tmp_path, kind
):
    cluster, handle, node = _job(local_cluster, _hostile_run(kind, 3))
    job_id = handle.remote_job_id("run")
    with cluster.client(node) as client:
        _wait_planted(client, job_id)
        # While the job runs, every read of its files answers at once: the planted exit code is no exit code.
        poll = jobs.read_job(client, job_id, 0, 0)
        assert poll.running and poll.exit_code is None
        assert jobs.poll_job(client, job_id, 0, 0).running
        with pytest.raises(UnsafeRemoteFile, match=ERROR[kind]):
            jobs.read_xcom(client, job_id)
        with pytest.raises(
            JobFailed, match=r"artifact ~/artifact.bin on rank 0 .*: .*(character device|FIFO)"
        ):
            upload_artifacts({0: client}, [node], ["~/artifact.bin"], str(tmp_path / "out"), False, print)

        started = time.monotonic()
        follower = GangJob(cluster, handle.job_id).follower("run", 0, 0, [node], "owner", emit=lambda _: None)
        try:
            step = follower.run(poll_interval_s=0.2)
        finally:
            follower.close()
        assert step.wake is Wake.DONE, step  # the wrapper's exit code replaced the planted one
        with pytest.raises(JobFailed, match=rf"rank 0 .*return.json on node rank 0 {ERROR[kind]}"):
            read_result(client, handle)
        assert time.monotonic() - started < 120


def test_the_triggerer_follows_a_job_with_hostile_files_to_its_end_without_hanging(local_cluster):
    cluster, handle, node = _job(local_cluster, _hostile_run("devzero", 3))
    with cluster.client(node) as client:
        _wait_planted(client, handle.remote_job_id("run"))
    trigger = SkyFollowTrigger(
        cluster_name=cluster.name,
        infra="local",
        conn_id=None,
        nodes=[node.to_dict()],
        rank=0,
        job_id=handle.job_id,
        phase="run",
        generation=0,
        owner="trigger-owner",
        poll_interval_s=0.2,
        min_wait_s=0,
    )

    async def first_event() -> dict:
        events = trigger.run()
        try:
            event = await asyncio.wait_for(anext(events), 120)
        finally:
            await events.aclose()
        return event.payload

    assert asyncio.run(first_event())["reason"] == "every rank exited 0"
    with (
        cluster.client(node) as client,
        pytest.raises(JobFailed, match=r"return\.json on node rank 0 is a symlink"),
    ):
        read_result(client, handle)


def test_a_log_or_pid_replaced_by_a_link_or_fifo_reads_as_empty_not_forever(local_cluster):
    _, nodes, key = local_cluster(1)
    with NodeClient(nodes[0], key) as client:
        jobs.start_job(
            client,
            "logs",
            'echo before; sleep 0.5; d="$AIRFLOW_SKY_JOB_DIR/gen-0"; '
            'ln -sfn /dev/zero "$d/log"; rm -f "$d/pid"; mkfifo "$d/pid"; echo planted >&2; sleep 2',
            {},
        )
        deadline = time.monotonic() + 60
        while client.exec("test -p ~/.airflow_sky/jobs/logs/gen-0/pid")[0] != 0:
            assert time.monotonic() < deadline, "the job did not plant its files"
            time.sleep(0.1)
        poll = jobs.read_job(client, "logs", 0, 0)
        assert (poll.data, poll.pid, poll.running) == (b"", None, True)
        shell = jobs.poll_job(client, "logs", 0, 0)
        assert (shell.data, shell.log_size, shell.running) == (
            b"",
            0,
            True,
        ) and shell.pid  # by its command line


def test_a_job_that_replaces_its_pid_file_is_still_seen_running_and_killed(local_cluster):
    _, nodes, key = local_cluster(1)
    with NodeClient(nodes[0], key) as client:
        script = 'd="$AIRFLOW_SKY_JOB_DIR/gen-0"; rm -f "$d/pid"; mkfifo "$d/pid"; echo planted; sleep 300'
        jobs.start_job(client, "unkillable", script, {})
        _wait_planted(client, "unkillable")
        poll = jobs.poll_job(client, "unkillable", 0, 0)
        assert poll.running and poll.pid, poll  # the wrapper, found by its command line
        assert jobs.kill_job(client, "unkillable", 0, grace_s=1.0) == 143
        after = jobs.poll_job(client, "unkillable", 0, 0)
        assert (after.running, after.exit_code) == (False, 143)
        assert client.exec("pgrep -f 'sleep 300'")[0] == 1, "the job's processes outlived the kill"
