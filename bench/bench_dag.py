"""A job as a DAG on 4, 16, 64 nodes: sky_job vs a hand-written SSHOperator DAG, both under `airflow dags test`.

    baseline  one SSHOperator per node for setup and one per node for run, setups before runs
              (cross_downstream), each connection an AIRFLOW_CONN_* ssh connection to a local node
    ours      sky_job on the same nodes (cluster kept, so neither side pays for provisioning)

Both run the same setup (`sleep 5`) and run (`sleep 5`) on the same 4 local nodes. `airflow dags test`
runs task instances one after another, so the baseline's per-node tasks run node after node; sky_job's
start/follow split starts every node before any task waits.

Run: `make bench` (or `.venv/bin/python bench/bench_dag.py [--sizes 4,16,64]`). A ratio < 1 means faster
than the baseline. The same DAGs under a real scheduler: bench_scheduler.py.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from airflow_sky.infra.base import Node, ProvisionRequest
from airflow_sky.infra.local.cloud import LocalCloud

SIZES = (4, 16)  # 64: the baseline alone runs 128 SSHOperators of 5 s one after another (~11 min)
SETUP = "sleep 5"  # a short pip install
RUN = 'sleep 5; echo "rank done"'
CLUSTER = "bench-dag"

BASELINE_DAG = """
from airflow.providers.ssh.operators.ssh import SSHOperator
from airflow.sdk import DAG, cross_downstream

with DAG("baseline_ssh", schedule=None) as dag:
    setups = [SSHOperator(task_id=f"setup_{{i}}", ssh_conn_id=f"bench_node{{i}}", command={setup!r}) for i in range({n})]
    runs = [SSHOperator(task_id=f"run_{{i}}", ssh_conn_id=f"bench_node{{i}}", command={run!r}) for i in range({n})]
    cross_downstream(setups, runs)
"""

OURS_DAG = """
from airflow.sdk import DAG
from airflow_sky import Task, sky_job

task = Task(name="bench", num_nodes={n}, setup={setup!r}, run={run!r})
with DAG("ours_sky_job", schedule=None) as dag:
    sky_job(task, cluster_name={cluster!r}, down=False)
"""


def connection_env(nodes: list[Node], key_file: Path) -> dict[str, str]:
    env = {}
    for node in nodes:
        conn = {
            "conn_type": "ssh",
            "host": node.ssh_host,
            "port": node.ssh_port,
            "login": node.ssh_user,
            "extra": {"key_file": str(key_file), "no_host_key_check": True},
        }
        env[f"AIRFLOW_CONN_BENCH_NODE{node.rank}"] = json.dumps(conn)
    return env


def dags_test(env: dict[str, str], dag_id: str) -> float:
    started = time.perf_counter()
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "airflow"), "dags", "test", dag_id],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"{dag_id} failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return elapsed


def measure(root: Path, env: dict[str, str], n: int) -> tuple[float, float]:
    """(ours, baseline) seconds of the setup+run job on n kept local nodes."""
    dags = Path(env["AIRFLOW__CORE__DAGS_FOLDER"])
    (dags / "baseline_ssh.py").write_text(textwrap.dedent(BASELINE_DAG.format(n=n, setup=SETUP, run=RUN)))
    (dags / "ours_sky_job.py").write_text(
        textwrap.dedent(OURS_DAG.format(n=n, setup=SETUP, run=RUN, cluster=CLUSTER))
    )
    cloud = LocalCloud()
    nodes = cloud.provision(ProvisionRequest(CLUSTER, n))
    try:
        key_file = Path(cloud.ssh_private_key(CLUSTER))
        run_env = {**env, **connection_env(nodes, key_file)}
        baseline = dags_test(run_env, "baseline_ssh")
        ours = dags_test(run_env, "ours_sky_job")
    finally:
        cloud.terminate(CLUSTER)
    return ours, baseline


def main() -> None:
    parser = argparse.ArgumentParser(description="sky_job vs SSHOperators under airflow dags test")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="node counts (default 4,16)")
    sizes = [int(part) for part in parser.parse_args().sizes.split(",") if part.strip()]
    with tempfile.TemporaryDirectory(prefix="airflow-sky-bench-dag-") as state:
        root = Path(state)
        os.environ.setdefault("AIRFLOW_SKY_LOCAL_ROOT", str(root / "local"))
        dags = root / "airflow" / "dags"
        dags.mkdir(parents=True)
        env = {
            **os.environ,
            "AIRFLOW_HOME": str(root / "airflow"),
            "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        }
        migrate = subprocess.run(
            [str(Path(sys.executable).parent / "airflow"), "db", "migrate"], env=env, capture_output=True
        )
        if migrate.returncode != 0:
            sys.exit(migrate.stderr.decode()[-3000:])
        print(f"$ {' '.join(sys.argv)}  ({os.cpu_count()} CPUs, Python {sys.version.split()[0]})")
        for n in sizes:
            ours, baseline = measure(root, env, n)
            name = f"{n}-node setup+run DAG, dags test"
            print(f"{name:<38} ours {ours:7.3f}s   baseline {baseline:7.3f}s   ratio {ours / baseline:5.2f}")


if __name__ == "__main__":
    main()
