"""Benchmarks of the local cluster and the remote layer, each as a ratio against a baseline run here.

    local up      8 nodes up (ours)              vs 8 bare interpreters importing asyncssh
    exec fan-out  `true` on every node (ours)    vs one OpenSSH `ssh` process per node
    sync          2,000-file workdir to 4 nodes  vs plain `rsync -e ssh` per node (and a re-sync of one file)

Run: `make bench` (or `.venv/bin/python bench/bench_remote.py`). A ratio < 1 means faster than the baseline.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from airflow_sky.infra.base import ProvisionRequest
from airflow_sky.infra.local.cloud import LocalCloud
from airflow_sky.node.client import NodeClient
from airflow_sky.node.sync import known_hosts_line, ssh_command_for, sync_dir


def timed(fn, *args):  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - started, result


def report(name: str, ours: float, baseline: float, unit: str = "s") -> None:
    print(
        f"{name:<38} ours {ours:7.3f}{unit}   baseline {baseline:7.3f}{unit}   ratio {ours / baseline:5.2f}"
    )


def bench_local_up(cloud: LocalCloud) -> None:
    ours, _ = timed(cloud.provision, ProvisionRequest("bench-up", 8))
    cloud.terminate("bench-up")

    def bare() -> None:
        procs = [subprocess.Popen([sys.executable, "-c", "import asyncssh"]) for _ in range(8)]
        for proc in procs:
            proc.wait()

    baseline, _ = timed(bare)
    report("local up, 8 nodes", ours, baseline)


def bench_exec_and_sync(cloud: LocalCloud, workdir: Path) -> None:
    nodes = cloud.provision(ProvisionRequest("bench-remote", 8))
    key = cloud.ssh_private_key("bench-remote")
    clients = [NodeClient(n, key) for n in nodes]
    with tempfile.TemporaryDirectory() as tmp:
        known_hosts = Path(tmp) / "known_hosts"
        known_hosts.write_text("".join(known_hosts_line(c) for c in clients))
        try:
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda c: c.exec("true"), clients))  # connect once, as a follow task does
                ours, _ = timed(lambda: list(pool.map(lambda c: c.exec("true"), clients)))
                ssh = [[*ssh_command_for(c, known_hosts), c.node.ssh_host] for c in clients]
                baseline, _ = timed(
                    lambda: list(pool.map(lambda cmd: subprocess.run([*cmd, "true"], check=True), ssh))
                )
                report("exec `true` on 8 nodes", ours, baseline)

                four = clients[:4]
                ours, _ = timed(lambda: list(pool.map(lambda c: sync_dir(c, workdir, "~/sky_workdir"), four)))

                def plain_rsync(client: NodeClient) -> None:
                    subprocess.run(
                        [
                            "rsync",
                            "-rlptz",
                            "-e",
                            shlex.join(ssh_command_for(client, known_hosts)),
                            f"{workdir}/",
                            f"{client.node.ssh_host}:plain_workdir/",
                        ],
                        check=True,
                    )

                baseline, _ = timed(lambda: list(pool.map(plain_rsync, four)))
                report("sync 2,000 files to 4 nodes", ours, baseline)
                changed = workdir / "pkg3" / "file3.py"
                changed.write_text("value = 'changed'\n")
                ours, _ = timed(lambda: list(pool.map(lambda c: sync_dir(c, workdir, "~/sky_workdir"), four)))
                baseline, _ = timed(lambda: list(pool.map(plain_rsync, four)))
                report("re-sync after one change, 4 nodes", ours, baseline)
        finally:
            for client in clients:
                client.close()
            cloud.terminate("bench-remote")


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="airflow-sky-bench-") as state:
        os.environ.setdefault("AIRFLOW_SKY_LOCAL_ROOT", str(Path(state) / "local"))
        workdir = Path(state) / "workdir"
        for i in range(2000):
            sub = workdir / f"pkg{i % 20}"
            sub.mkdir(parents=True, exist_ok=True)
            (sub / f"file{i}.py").write_text(f"value = {i}\n" * 20)
        cloud = LocalCloud()
        bench_local_up(cloud)
        bench_exec_and_sync(cloud, workdir)


if __name__ == "__main__":
    main()
