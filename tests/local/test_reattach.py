"""A run task killed mid-job (SIGKILL) and retried reattaches to the running job: never a second copy."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap

from airflow_sky import Task
from airflow_sky.gang.phases import register_job
from airflow_sky.infra.local import daemon
from airflow_sky.infra.registry import open_cluster
from airflow_sky.node.client import NodeClient
from airflow_sky.node.jobs import start_job

FOLLOWER = textwrap.dedent(
    """
    import json, sys
    from airflow_sky.infra.base import Node
    from airflow_sky.infra.registry import open_cluster
    from airflow_sky.gang.gang_job import GangJob

    nodes, name = [Node.from_dict(n) for n in json.loads(sys.argv[1])], sys.argv[2]
    cluster = open_cluster(name, "local")
    # The same owner name as the killed try: a retried task instance takes its watch lease back at once.
    follower = GangJob(cluster, 1).follower(
        "run", 0, 0, nodes, "dag/run/run_follow/0",
        emit=lambda line: print(line, flush=True),
    )
    print("EXIT", follower.run().wake, flush=True)
    """
)


def test_killed_follower_is_retried_and_reattaches_to_the_one_running_job(local_cluster):
    name, nodes, key = local_cluster(2)
    # Sleeps until the test ends it (a fixed sleep could end before the check on a slow machine).
    script = "echo started; sleep 600; echo ended"
    clients = [NodeClient(n, key) for n in nodes]
    try:
        assert all(start_job(c, "1-run", script, {}, 0).started for c in clients)
        register_job(open_cluster(name, "local"), Task(run=script, num_nodes=2), nodes, submit_key="test")
        args = [sys.executable, "-c", FOLLOWER, json.dumps([n.to_dict() for n in nodes]), name]
        first = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
        assert first.stdout is not None
        assert "started" in first.stdout.readline()
        first.send_signal(signal.SIGKILL)  # the worker running the task dies
        first.wait()

        # The retry: run_start again (attaches), then a new follower.
        assert [start_job(c, "1-run", script, {}, 0).started for c in clients] == [False, False]
        all_sleeps = []
        for node in nodes:
            sleeps = [
                p
                for p in daemon.processes_with_marker(daemon.marker(name, node.instance_id))
                if p.name() == "sleep"
            ]
            assert len(sleeps) == 1, f"rank {node.rank} runs {len(sleeps)} copies"
            all_sleeps.extend(sleeps)
        retry = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for sleep in all_sleeps:
            sleep.terminate()  # the job goes on to `echo ended` and exits 0
        out, err = retry.communicate(timeout=120)
    finally:
        for client in clients:
            client.close()
    assert retry.returncode == 0, err
    assert out.count("started") == 1 and "ended" in out
    assert out.strip().endswith("EXIT DONE")
