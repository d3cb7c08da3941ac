"""A node that stops answering while the infra reports it up is a network blip, for a while."""

from __future__ import annotations

import dataclasses
import time

import pytest

from airflow_sky import Task
from airflow_sky.errors import JobFailed
from airflow_sky.gang.follow import GangFollower
from airflow_sky.gang.recovery import RecoveryState, decide
from airflow_sky.infra.registry import open_cluster
from airflow_sky.node.client import NodeClient
from tests.ports import free_port


def test_unreachable_node_that_the_infra_reports_up_is_waited_for_then_fails_as_unreachable(local_cluster):
    name, nodes, key = local_cluster(1)
    cluster = open_cluster(name, "local")
    policy = Task(run="true").job_recovery

    def triage(rank: int, code: int | None):  # the operator's own rule, against the real infra's status
        return decide(cluster.unhealthy_ranks(nodes), code, policy, RecoveryState(generation=0))

    # The node runs (the infra says so) but its SSH port refuses us: what a network partition looks like.
    unreachable = NodeClient(dataclasses.replace(nodes[0], ssh_port=free_port()), key, conn_retry_attempts=1)
    follower = GangFollower(
        "1-run",
        0,
        0,
        {0: unreachable},
        emit=print,
        triage=triage,
        poll_interval_s=0.1,
        unreachable_grace_s=0.5,
        max_unreachable_s=3.0,
    )
    started = time.monotonic()
    with pytest.raises(JobFailed, match="rank 0: node unreachable"):
        follower.run()
    assert time.monotonic() - started >= 3.0  # not failed at the end of the grace period


def test_a_node_whose_server_stops_answering_fails_sftp_within_its_deadline(local_cluster, monkeypatch):
    import os
    import signal

    import psutil

    from airflow_sky.errors import RemoteError
    from airflow_sky.infra.local import daemon
    from airflow_sky.node import client as node_client

    monkeypatch.setattr(node_client, "SFTP_TIMEOUT_S", 2.0)
    name, nodes, key = local_cluster(1)
    with NodeClient(nodes[0], key) as client:
        assert client.read_file("nothing-here") is None  # the SFTP channel is open
        server = [p for p in daemon.processes_with_marker(name) if "node_server" in " ".join(p.cmdline())]
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
