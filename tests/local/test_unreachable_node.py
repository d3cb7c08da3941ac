"""A node that stops answering while the infra reports it up is a network blip, for a while."""

from __future__ import annotations

import dataclasses
import time

import pytest

from airflow_sky import Task
from airflow_sky.gang.follow import Wake
from airflow_sky.gang.gang_job import GangJob
from airflow_sky.gang.phases import register_job
from airflow_sky.gang.watcher import recovery_triage
from airflow_sky.infra.registry import open_cluster
from airflow_sky.node.client import NodeClient
from tests.ports import free_port


def test_unreachable_node_that_the_infra_reports_up_is_waited_for_then_fails_as_unreachable(local_cluster):
    name, nodes, _key = local_cluster(1)
    cluster = open_cluster(name, "local")
    task = Task(run="true")
    register_job(cluster, task, nodes, submit_key="test")
    # The node runs (the infra says so) but its SSH port refuses us: what a network partition looks like.
    unreachable = [dataclasses.replace(nodes[0], ssh_port=free_port())]
    follower = GangJob(cluster, 1).follower(
        "run",
        0,
        0,
        unreachable,
        "task-0",
        emit=print,
        triage=recovery_triage(task.job_recovery),  # the operator's own rule, against the real infra's status
        state_interval_s=0.1,
    )
    follower.watcher.unreachable_grace_s = 0.5
    follower.watcher.max_unreachable_s = 3.0
    started = time.monotonic()
    step = follower.run(0.1)
    assert step.wake is Wake.FAILED and step.error is not None
    assert "rank 0: node unreachable" in str(step.error)
    assert time.monotonic() - started >= 3.0  # not failed at the end of the grace period
    follower.close()


def test_a_node_whose_server_stops_answering_fails_sftp_within_its_deadline(local_cluster, monkeypatch):
    import os
    import signal

    import psutil

    from airflow_sky.errors import RemoteError
    from airflow_sky.infra.local import daemon
    from airflow_sky.node import connection as node_connection

    monkeypatch.setattr(node_connection, "SFTP_TIMEOUT_S", 2.0)
    name, nodes, key = local_cluster(1)
    with NodeClient(nodes[0], key) as client:
        assert client.read_file("nothing-here") is None  # the SFTP channel is open
        server = [
            p
            for p in daemon.processes_with_marker(name)
            if "node_server" in " ".join(p.cmdline()) and p.name() != "unshare"  # not its namespace's wrapper
        ]
        assert len(server) == 1
        os.kill(server[0].pid, signal.SIGSTOP)  # the node hangs, its TCP connection stays open
        try:
            started = time.monotonic()
            with pytest.raises(RemoteError, match=r"read of .* on node rank 0 .*no answer within 2s"):
                client.read_file("still-nothing")
            assert time.monotonic() - started < 15
        finally:
            os.kill(server[0].pid, signal.SIGCONT)
    assert psutil.pid_exists(server[0].pid)
