"""sky_job vs a hand-written SSHOperator DAG under a real scheduler: LocalExecutor, PostgreSQL, defaults.

    baseline   one SSHOperator per node for setup and one per node for run, setups before runs
               (cross_downstream); each node an AIRFLOW_CONN_* ssh connection
    blocking   sky_job on the same nodes, follow tasks in their worker slots
    deferrable sky_job with deferrable follow tasks (waiting in the triggerer)

Every job runs setup `sleep 5` and run `sleep 5` on the same kept local cluster (neither side provisions),
triggered over the REST API; trigger-to-success is timed, the three DAGs taking turns, `--runs` each. Airflow
runs as in production: `airflow api-server`, `scheduler`, `dag-processor`, `triggerer` on PostgreSQL, with
Airflow's default parallelism (32) and max_active_tasks_per_dag (16).

Also measured:
- slots: worker slots the deferrable job's run follow tasks hold while `--slots-nodes` nodes run `sleep 60`
  (sampled every second once every rank runs; target 0 once they deferred);
- recovery: seconds from a node's loss (killed like a spot preemption) to every rank's run started again,
  for each of `--recovery-sizes`.

Everything runs in a private network namespace (`unshare --net`, root): PostgreSQL, Airflow and the nodes
listen on loopback only. Needs PostgreSQL installed (`make bootstrap-tests` installs it).

Usage: python bench/bench_scheduler.py [--sizes 4,16,64] [--runs 3] [--slots-nodes 16] [--recovery-sizes 4,16]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the stack helpers of the deployment tests (PostgreSQL, process groups)

import httpx  # noqa: E402
from common import machine  # noqa: E402  # bench/common.py

from tests.deploy.celery_stack import Processes, start_postgres  # noqa: E402

AIRFLOW = str(Path(sys.executable).parent / "airflow")
API = "http://127.0.0.1:8080"
SETUP = "sleep 5"
RUN = 'sleep 5; echo "rank done"'
INNER_ENV = "AIRFLOW_SKY_BENCH_INNER"

BASELINE_DAG = """
from airflow.providers.ssh.operators.ssh import SSHOperator
from airflow.sdk import DAG, cross_downstream

with DAG({dag_id!r}, schedule=None, catchup=False) as dag:
    setups = [SSHOperator(task_id=f"setup_{{i}}", ssh_conn_id=f"bench_node{{i}}", command={setup!r}) for i in range({n})]
    runs = [SSHOperator(task_id=f"run_{{i}}", ssh_conn_id=f"bench_node{{i}}", command={run!r}) for i in range({n})]
    cross_downstream(setups, runs)
"""

OURS_DAG = """
from airflow.sdk import DAG
from airflow_sky import Task, sky_job

task = Task(name="bench", num_nodes={n}, setup={setup!r}, run={run!r})
with DAG({dag_id!r}, schedule=None, catchup=False) as dag:
    sky_job(task, cluster_name={cluster!r}, down=False, setup={with_setup!r}, deferrable={deferrable!r},
            defer_after_s={defer_after_s!r}, max_recoveries=3)
"""


class Stack:
    """PostgreSQL and the four Airflow components, LocalExecutor, in `root`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.procs = Processes(root)
        self.env: dict[str, str] = {}
        self.client = httpx.Client(base_url=API, timeout=60)

    def start(self) -> None:
        db_url = start_postgres(self.root, self.procs)
        (self.root / "dags").mkdir(exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_", "AIRFLOW__"))}
        env.update(
            {
                "AIRFLOW_HOME": str(self.root / "airflow"),
                "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": db_url,
                "AIRFLOW__CORE__DAGS_FOLDER": str(self.root / "dags"),
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{API}/execution/",
                "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "30",
                "AIRFLOW__API__PORT": "8080",
                "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(16),
                "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
                "AIRFLOW_SKY_LOCAL_ROOT": os.environ["AIRFLOW_SKY_LOCAL_ROOT"],
                "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            }
        )
        self.env = env
        migrate = subprocess.run([AIRFLOW, "db", "migrate"], env=env, capture_output=True, text=True)
        if migrate.returncode != 0:
            raise RuntimeError(f"airflow db migrate failed: {migrate.stderr[-3000:]}")

    def start_airflow(self, extra_env: dict[str, str]) -> None:
        """Start (or restart, with the nodes' connections) the Airflow components."""
        self.stop_airflow()
        env = {**self.env, **extra_env}
        for component in ("api-server", "scheduler", "dag-processor", "triggerer"):
            argv = [AIRFLOW, *component.split()]
            self.procs.start(component, argv, env)
        token = self.wait(
            "the API server", lambda: self.client.get("/auth/token").json()["access_token"], 240
        )
        self.client.headers["Authorization"] = f"Bearer {token}"

    def stop_airflow(self) -> None:
        airflow = Processes(self.root)
        for name in ("api-server", "scheduler", "dag-processor", "triggerer"):
            proc = self.procs.started.pop(name, None)
            if proc is not None:
                airflow.started[name] = proc
        airflow.stop_all()

    def wait(self, what: str, check: Callable[[], Any], timeout_s: float) -> Any:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.procs.check()
            try:
                value = check()
            except (httpx.HTTPError, KeyError, ValueError):
                value = None
            if value:
                return value
            time.sleep(0.5)
        raise RuntimeError(f"timed out after {timeout_s:.0f}s waiting for {what}; logs in {self.root}")

    def write_dag(self, dag_id: str, source: str) -> None:
        (self.root / "dags" / f"{dag_id}.py").write_text(textwrap.dedent(source))

    def wait_parsed(self, dag_ids: list[str]) -> None:
        for dag_id in dag_ids:
            self.wait(
                f"DAG {dag_id}", lambda d=dag_id: self.client.get(f"/api/v2/dags/{d}").status_code == 200, 300
            )

    def trigger(self, dag_id: str) -> str:
        response = self.client.post(f"/api/v2/dags/{dag_id}/dagRuns", json={"logical_date": None})
        response.raise_for_status()
        return str(response.json()["dag_run_id"])

    def run_state(self, dag_id: str, run_id: str) -> str:
        return str(self.client.get(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}").json()["state"])

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        url = f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances"
        return list(self.client.get(url, params={"limit": 1000}).json()["task_instances"])

    def timed_run(self, dag_id: str, timeout_s: float = 1200) -> tuple[float, str]:
        """Trigger `dag_id`; seconds until its run ended, and its state."""
        started = time.perf_counter()
        run_id = self.trigger(dag_id)
        state = self.wait(
            f"{dag_id} to end",
            lambda: (s := self.run_state(dag_id, run_id)) in ("success", "failed") and s,
            timeout_s,
        )
        return time.perf_counter() - started, state

    def stop(self) -> None:
        self.procs.stop_all()


def connections(nodes: list[Any], key_file: str) -> dict[str, str]:
    env = {}
    for node in nodes:
        conn = {
            "conn_type": "ssh",
            "host": node.ssh_host,
            "port": node.ssh_port,
            "login": node.ssh_user,
            "extra": {"key_file": key_file, "no_host_key_check": True},
        }
        env[f"AIRFLOW_CONN_BENCH_NODE{node.rank}"] = json.dumps(conn)
    return env


def overhead(stack: Stack, sizes: list[int], runs: int) -> list[str]:
    """The same setup+run job as baseline, blocking and deferrable sky_job; one table row per DAG and size."""
    from airflow_sky.infra.base import ProvisionRequest
    from airflow_sky.infra.local.cloud import LocalCloud

    cloud = LocalCloud()
    rows = []
    for n in sizes:
        cluster = f"bench-sched-{n}"
        nodes = cloud.provision(ProvisionRequest(cluster, n))
        try:
            stack.start_airflow(connections(nodes, cloud.ssh_private_key(cluster)))
            dags = {
                f"baseline_{n}": BASELINE_DAG.format(dag_id=f"baseline_{n}", n=n, setup=SETUP, run=RUN),
                f"blocking_{n}": OURS_DAG.format(
                    dag_id=f"blocking_{n}",
                    n=n,
                    setup=SETUP,
                    run=RUN,
                    cluster=cluster,
                    with_setup=True,
                    deferrable=False,
                    defer_after_s=None,
                ),
                f"deferrable_{n}": OURS_DAG.format(
                    dag_id=f"deferrable_{n}",
                    n=n,
                    setup=SETUP,
                    run=RUN,
                    cluster=cluster,
                    with_setup=True,
                    deferrable=True,
                    defer_after_s=None,
                ),
            }
            for dag_id, source in dags.items():
                stack.write_dag(dag_id, source)
            stack.wait_parsed(list(dags))
            times: dict[str, list[float]] = {dag_id: [] for dag_id in dags}
            failed: dict[str, int] = {dag_id: 0 for dag_id in dags}
            for _ in range(runs):
                for dag_id in dags:  # taking turns: a drift of the machine hits all three alike
                    seconds, state = stack.timed_run(dag_id)
                    times[dag_id].append(seconds)
                    failed[dag_id] += state != "success"
                    print(f"  {dag_id:<16} {seconds:6.1f}s {state}", flush=True)
            base = statistics.median(times[f"baseline_{n}"])
            for dag_id, values in times.items():
                median = statistics.median(values)
                shown = " / ".join(f"{v:.1f}" for v in values)
                rows.append(
                    f"{n:>5} {dag_id.rsplit('_', 1)[0]:<11} {median:7.1f}s  ({shown})  ratio {median / base:4.2f}"
                    + (f"  FAILED {failed[dag_id]}/{runs}" if failed[dag_id] else "")
                )
        finally:
            cloud.terminate(cluster)
    return rows


def slots(stack: Stack, n: int) -> str:
    """Worker slots held by run follow tasks while `n` ranks run `sleep 60` with deferrable follows."""
    from airflow_sky.infra.base import ProvisionRequest
    from airflow_sky.infra.local.cloud import LocalCloud

    cloud = LocalCloud()
    cluster = f"bench-slots-{n}"
    nodes = cloud.provision(ProvisionRequest(cluster, n))
    try:
        stack.start_airflow(connections(nodes, cloud.ssh_private_key(cluster)))
        dag_id = f"slots_{n}"
        stack.write_dag(
            dag_id,
            OURS_DAG.format(
                dag_id=dag_id,
                n=n,
                setup="true",
                run="sleep 60",
                cluster=cluster,
                with_setup=False,
                deferrable=True,
                defer_after_s=0,
            ),
        )
        stack.wait_parsed([dag_id])
        run_id = stack.trigger(dag_id)
        samples: list[int] = []
        deferred_seen = 0
        while stack.run_state(dag_id, run_id) not in ("success", "failed"):
            follows = [
                ti for ti in stack.task_instances(dag_id, run_id) if ti["task_id"].endswith("run_follow")
            ]
            deferred = sum(ti["state"] == "deferred" for ti in follows)
            if deferred_seen or deferred == n:
                deferred_seen += 1
                samples.append(sum(ti["state"] == "running" for ti in follows))
            time.sleep(1)
        steady = samples[5:-5] or samples  # away from the deferring and the ending edges
        return (
            f"slots: {n} ranks running `sleep 60`, deferrable follows: worker slots held by follow tasks "
            f"once all deferred: max {max(steady, default=-1)}, mean {statistics.fmean(steady or [0]):.2f} "
            f"over {len(steady)} samples (target 0)"
        )
    finally:
        cloud.terminate(cluster)


def recovery(stack: Stack, n: int, probe_root: Path) -> str:
    """Seconds from rank 1's node being killed to every rank's run started again (generation 1)."""
    from airflow_sky.infra.base import ProvisionRequest
    from airflow_sky.infra.local.cloud import LocalCloud

    cloud = LocalCloud()
    cluster = f"bench-recover-{n}"
    probe = probe_root / f"recover-{n}"
    probe.mkdir(parents=True)
    run = (
        f'date +%s.%N > {probe}/gen-"$AIRFLOW_SKY_RECOVERY_COUNT"-rank-"$SKYPILOT_NODE_RANK"; '
        'if [ "$AIRFLOW_SKY_RECOVERY_COUNT" = 0 ]; then sleep 600; else sleep 5; fi'
    )
    nodes = cloud.provision(ProvisionRequest(cluster, n))
    try:
        stack.start_airflow(connections(nodes, cloud.ssh_private_key(cluster)))
        dag_id = f"recover_{n}"
        stack.write_dag(
            dag_id,
            OURS_DAG.format(
                dag_id=dag_id,
                n=n,
                setup="true",
                run=run,
                cluster=cluster,
                with_setup=True,
                deferrable=True,
                defer_after_s=None,
            ),
        )
        stack.wait_parsed([dag_id])
        run_id = stack.trigger(dag_id)
        stack.wait("every rank's first run", lambda: len(list(probe.glob("gen-0-rank-*"))) == n, 600)
        time.sleep(3)
        killed_at = time.time()
        cloud.preempt(cluster, 1)
        stack.wait("every rank's run again", lambda: len(list(probe.glob("gen-1-rank-*"))) == n, 900)
        back = max(float(p.read_text()) for p in probe.glob("gen-1-rank-*"))
        state = stack.wait(
            f"{dag_id} to end",
            lambda: (s := stack.run_state(dag_id, run_id)) in ("success", "failed") and s,
            900,
        )
        return f"recovery: {n} nodes, rank 1's node killed: every rank running again after {back - killed_at:.1f}s (run {state})"
    finally:
        cloud.terminate(cluster)


def inner(args: argparse.Namespace) -> None:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    with tempfile.TemporaryDirectory(prefix="airflow-sky-bench-sched-", dir="/var/tmp") as state:
        root = Path(state)
        os.environ["AIRFLOW_SKY_LOCAL_ROOT"] = str(root / "local")
        stack = Stack(root)
        lines = []
        try:
            stack.start()
            if args.sizes:
                lines += overhead(stack, args.sizes, args.runs)
            if args.slots_nodes:
                lines.append(slots(stack, args.slots_nodes))
            for n in args.recovery_sizes:
                lines.append(recovery(stack, n, root))
        finally:
            stack.stop()
            data_dir = root / "pg_data_dir"
            if data_dir.exists():
                subprocess.run(["rm", "-rf", data_dir.read_text()], check=False)
        print(f"\n$ {' '.join(sys.argv)}\n{machine()}")
        print("nodes dag         median  (each run)           ratio to baseline (target <= 1.0)")
        for line in lines:
            print(line)


def _sizes(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=_sizes, default=[4, 16], help="node counts (default 4,16)")
    parser.add_argument("--runs", type=int, default=3, help="runs of each DAG per size (default 3)")
    parser.add_argument("--slots-nodes", type=int, default=16, help="0 skips the slots measurement")
    parser.add_argument("--recovery-sizes", type=_sizes, default=[4, 16], help="'' skips recovery")
    args = parser.parse_args()
    if os.environ.get(INNER_ENV):
        inner(args)
        return
    if os.geteuid() != 0:
        sys.exit("bench_scheduler needs root: PostgreSQL runs as its own user, Airflow in a private network")
    env = {**os.environ, INNER_ENV: "1"}
    sys.exit(subprocess.run(["unshare", "--net", "--", sys.executable, *sys.argv], env=env).returncode)


if __name__ == "__main__":
    main()
