"""A real 2-node torchrun DDP job started through the remote-job layer with SkyPilot's env on local nodes."""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path

from airflow_sky.infra.local.cloud import LocalCloud
from airflow_sky.node.client import NodeClient
from airflow_sky.node.jobs import poll_job, read_xcom, start_job
from airflow_sky.node.sync import sync_dir
from airflow_sky.task import Task, envs
from tests.ports import free_port

WORKLOADS = Path(__file__).resolve().parent.parent / "workloads"


def test_two_node_torchrun_ddp_reports_world_size_two(local_cluster):
    name, nodes, key = local_cluster(2)
    port = free_port()
    task = Task(
        name="ddp-tiny",
        num_nodes=2,
        run=[
            'MASTER_ADDR=$(echo "$SKYPILOT_NODE_IPS" | head -n1)',
            f"torchrun --nnodes=$SKYPILOT_NUM_NODES --nproc_per_node=1 --master_addr=$MASTER_ADDR "
            f"--master_port={port} --node_rank=$SKYPILOT_NODE_RANK ddp_tiny.py",
        ],
    )
    ips = [n.internal_ip for n in nodes]
    task_id = envs.make_task_id(name, 1, datetime.now())
    node_envs = envs.run_envs(task, ips, LocalCloud().cluster_info(name), task_id, num_gpus_per_node=0)
    clients = [NodeClient(n, key) for n in nodes]
    try:
        for client in clients:
            sync_dir(client, WORKLOADS, "~/sky_workdir")
        for client, node_env in zip(clients, node_envs, strict=True):
            start_job(client, "ddp", task.run or "", node_env)
        logs = {}
        deadline = time.monotonic() + 240
        for client in clients:
            offset, data = 0, b""
            while True:
                assert time.monotonic() < deadline, f"torchrun did not finish: {data.decode()[-2000:]}"
                poll = poll_job(client, "ddp", 0, offset)
                data += poll.data
                offset = poll.next_offset
                if not poll.running and poll.caught_up:
                    break
                time.sleep(0.2)
            assert poll.exit_code == 0, data.decode()[-3000:]
            logs[client.node.rank] = data.decode()
        results = [json.loads(read_xcom(c, "ddp") or b"null") for c in clients]
    finally:
        for client in clients:
            client.close()
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["world_size"] == 2 for r in results)
    assert results[0]["last_loss"] < results[0]["first_loss"]
    assert "world_size=2 node_rank=0" in logs[0] and "world_size=2 node_rank=1" in logs[1]
    assert len(set(ips)) == 2
