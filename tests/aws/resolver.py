"""Test-only: which local node plays which EC2 instance that moto "launched".

moto answers the EC2 API but its instances are not machines (their IPs lead nowhere, and the tests never
connect to them). So a module's tests bring up a local cluster of *play nodes* (real SSH servers of the
embedded local infra) and AwsCloud, through AIRFLOW_SKY_AWS_ENDPOINT_RESOLVER, asks this module where an
instance is: each new instance id gets the next play node, round robin, recorded in a file so that the
Airflow processes a test starts resolve the same way. The host key returned is the play node's own, standing
in for the key cloud-init prints to the console.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any

PLAY_ENV = "AIRFLOW_SKY_TEST_AWS_PLAY"  # a JSON file: {"nodes": [Node dicts], "assigned": {id: index}}


def resolve(instance_id: str) -> dict[str, Any]:
    path = Path(os.environ[PLAY_ENV])
    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        play = json.loads(path.read_text())
        assigned: dict[str, int] = play.setdefault("assigned", {})
        if instance_id not in assigned:
            assigned[instance_id] = len(assigned) % len(play["nodes"])
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(play))
            os.replace(tmp, path)
    node = play["nodes"][assigned[instance_id]]
    return {
        "host": node["ssh_host"],
        "port": node["ssh_port"],
        "user": node["ssh_user"],
        "internal_ip": node["internal_ip"],
        "host_key": node["host_key"],
    }


def play_node_index(instance_id: str) -> int:
    return int(json.loads(Path(os.environ[PLAY_ENV]).read_text())["assigned"][instance_id])
