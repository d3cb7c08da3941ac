"""Scale of the gang core on the embedded local cluster: what `airflow-sky launch` costs at 16, 64, 128 nodes.

Prints figures and ratios, each against a baseline measured in this process:
- launch of an N-node `echo` job (provisioning included) vs a hand-written SSH loop over the same N nodes
  (connect, `echo`, disconnect, twice per node: what the job's setup and run need at the least);
- time(64) / time(16) (the target is <= 3: the cost per node must not grow with the node count);
- peak SSH connections open on the node servers during the job, per node (target <= 2);
- fail-fast at 64 nodes: rank 63 exits 1 while the others sleep: seconds from that exit to the job state's
  verdict with every rank killed, and to the launch's exit;
- with `--big`, a 128-node job under a soft open-file limit of 1024 (the launcher raises its own).

Usage: python bench/bench_scale.py [--sizes 16,64] [--failfast 64] [--big]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "airflow_sky.client.cli"]
# The baseline imports the SSH hook, and with it Airflow's config: never the user's ~/airflow.
os.environ.setdefault("AIRFLOW_HOME", str(REPO / ".airflow_home" / "bench"))


def _env(state: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(
        {
            "AIRFLOW_SKY_HOME": str(state / "sky-home"),
            "AIRFLOW_SKY_LOCAL_ROOT": str(state / "local"),
            "AIRFLOW_SKY_AIRFLOW_HOME": str(state / "airflow"),
            "AIRFLOW_SKY_SSH_CONFIG": str(state / "ssh_config"),
            "AIRFLOW_SKY_LOCAL_SSH_PORT": "2290",
        }
    )
    return env


class ConnectionSampler:
    """Counts ESTABLISHED TCP connections to the node servers of a local state root, every 0.5 s."""

    def __init__(self, local_root: Path) -> None:
        self.local_root = local_root
        self.peak = 0
        self.peak_per_node = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _servers(self) -> set[tuple[str, int]]:
        servers = set()
        for path in self.local_root.glob("*/instances/*/node.json"):
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            servers.add((str(record["ip"]), int(record["port"])))
        return servers

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            servers = self._servers()
            if not servers:
                continue
            per_node: dict[tuple[str, int], int] = {}
            for conn in psutil.net_connections(kind="tcp"):
                if conn.status == psutil.CONN_ESTABLISHED and conn.laddr and tuple(conn.laddr) in servers:
                    key = (conn.laddr.ip, conn.laddr.port)
                    per_node[key] = per_node.get(key, 0) + 1
            self.peak = max(self.peak, sum(per_node.values()))
            self.peak_per_node = max(self.peak_per_node, max(per_node.values(), default=0))

    def __enter__(self) -> ConnectionSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _task_file(state: Path, name: str, nodes: int, run: str) -> Path:
    path = state / f"{name}.yaml"
    path.write_text(
        f"name: {name}\nnum_nodes: {nodes}\nsetup: echo setup $SKYPILOT_SETUP_NODE_RANK\nrun: {json.dumps(run)}\n"
    )
    return path


def _launch(
    state: Path, cluster: str, task: Path, down: bool = True, soft_nofile: int | None = None
) -> tuple[float, str, int]:
    def limit() -> None:
        if soft_nofile is not None:
            resource.setrlimit(
                resource.RLIMIT_NOFILE, (soft_nofile, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
            )

    args = [*CLI, "launch", "-c", cluster, str(task), "-y"] + (["--down"] if down else [])
    started = time.monotonic()
    proc = subprocess.run(args, env=_env(state), capture_output=True, text=True, preexec_fn=limit, cwd=REPO)
    return time.monotonic() - started, proc.stdout + proc.stderr, proc.returncode


def baseline_ssh_loop(nodes: int) -> float:
    """A hand-written loop: provision the nodes, then connect + `echo` + close on each, twice."""
    from airflow_sky.infra.base import ProvisionRequest
    from airflow_sky.infra.local.cloud import LocalCloud
    from airflow_sky.node.client import NodeClient

    cloud = LocalCloud()
    name = f"baseline{nodes}"
    started = time.monotonic()
    try:
        provisioned = cloud.provision(ProvisionRequest(name, nodes))
        for _ in range(2):
            for node in provisioned:
                with NodeClient(node, cloud.ssh_private_key(name)) as client:
                    client.exec("echo ok")
        return time.monotonic() - started
    finally:
        cloud.terminate(name)


def scale(sizes: list[int]) -> dict[int, float]:
    times: dict[int, float] = {}
    for n in sizes:
        with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
            state = Path(tmp)
            os.environ["AIRFLOW_SKY_LOCAL_ROOT"] = str(state / "local")
            os.environ["AIRFLOW_SKY_LOCAL_SSH_PORT"] = "2290"
            base = baseline_ssh_loop(n)
            task = _task_file(state, f"echo{n}", n, "echo run $SKYPILOT_NODE_RANK of $SKYPILOT_NUM_NODES")
            with ConnectionSampler(state / "local") as sampler:
                seconds, output, rc = _launch(state, f"scale{n}", task)
            if rc != 0:
                print(output[-3000:])
                raise SystemExit(f"the {n}-node launch failed ({rc})")
            times[n] = seconds
            print(
                f"{n:4d} nodes: launch {seconds:6.1f} s ({seconds / n:.2f} s/node); hand-written SSH loop "
                f"{base:5.1f} s; ratio {seconds / base:5.2f}; peak SSH connections {sampler.peak} "
                f"({sampler.peak / n:.2f} per node, at most {sampler.peak_per_node} on one node)",
                flush=True,
            )
    if 16 in times and 64 in times:
        print(f"time(64) / time(16) = {times[64] / times[16]:.2f} (target <= 3)")
    return times


def failfast(n: int) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-failfast-") as tmp:
        state = Path(tmp)
        os.environ["AIRFLOW_SKY_LOCAL_ROOT"] = str(state / "local")
        last = n - 1
        run = (
            f'if [ "$SKYPILOT_NODE_RANK" = {last} ]; then sleep {max(30, n)}; echo "FAIL_AT $(date +%s.%N)"; '
            "exit 1; fi; sleep 3600"
        )
        task = _task_file(state, f"ff{n}", n, run)
        cluster = f"failfast{n}"
        started = time.time()
        seconds, output, rc = _launch(state, cluster, task, down=False)
        ended = started + seconds
        marks = re.findall(r"FAIL_AT (\d+\.\d+)", output)
        from airflow_sky.gang.state import JobStates
        from airflow_sky.infra.local import daemon, layout
        from airflow_sky.infra.local.state_store import LocalStateStore

        job = JobStates(LocalStateStore(layout.state_dir(cluster))).require(1)
        sleeping = [p for p in daemon.processes_with_marker(cluster) if p.name() == "sleep"]
        subprocess.run([*CLI, "down", cluster], env=_env(state), capture_output=True, cwd=REPO)
        if rc == 0 or not marks:
            print(output[-3000:])
            raise SystemExit("the fail-fast job did not fail as expected")
        failed_at = float(marks[0])
        verdict = float(job.info["ended_at"]) - failed_at
        print(
            f"fail-fast at {n} nodes: verdict with every rank killed {verdict:.1f} s after rank {last}'s exit "
            f"(killed: {job.phase('run').killed}, sleeps left: {len(sleeping)}); the launch exited "
            f"{ended - failed_at:.1f} s after it (status {job.status.value})"
        )


def big(n: int = 128) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-big-") as tmp:
        state = Path(tmp)
        os.environ["AIRFLOW_SKY_LOCAL_ROOT"] = str(state / "local")
        task = _task_file(state, f"echo{n}", n, "echo run $SKYPILOT_NODE_RANK")
        with ConnectionSampler(state / "local") as sampler:
            seconds, output, rc = _launch(state, f"big{n}", task, soft_nofile=1024)
        status = "succeeded" if rc == 0 else f"FAILED ({rc})"
        print(
            f"{n} nodes under `ulimit -n 1024`: {status} in {seconds:.1f} s; peak SSH connections "
            f"{sampler.peak} ({sampler.peak / n:.2f} per node)"
        )
        if rc != 0:
            print(output[-3000:])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="16,64", help="node counts to launch (comma-separated)")
    parser.add_argument("--failfast", type=int, default=64, help="node count of the fail-fast run (0: skip)")
    parser.add_argument("--big", action="store_true", help="also launch 128 nodes under ulimit -n 1024")
    args = parser.parse_args()
    scale([int(n) for n in args.sizes.split(",") if n])
    if args.failfast:
        failfast(args.failfast)
    if args.big:
        big()


if __name__ == "__main__":
    main()
