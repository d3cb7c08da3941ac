"""Workdir sync to 4 local nodes: our sync tasks vs plain `rsync -a` over ssh, first sync and re-sync.

    workdir  5,000 small files (1 KiB of text each, in 50 folders) plus 50 MB in 5 larger files
             (random bytes: model weights, a data shard)
    ours     SkySyncOperator.execute for each of the 4 ranks (what the mapped sync tasks do: the hook opens the
             node's connection, node.files.upload_task_files syncs the workdir to ~/sky_workdir), the 4 ranks
             at once on threads, as mapped task instances run side by side under a scheduler
    baseline `rsync -a -e ssh <workdir>/ node:plain_workdir/`, one per node, the 4 at once
    re-sync  the same again after one small file changed

Both sides use the same OpenSSH client options (cluster key, pinned host key) to the same nodes. Each figure
is the median of --repeats tries; the destinations are removed before each first sync. Target: ours <= 1.2x
the baseline for both the first sync and the re-sync.

Usage: python bench/bench_sync.py [--nodes 4] [--files 5000] [--big-mb 50] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from common import (  # bench/common.py (the script's own folder)
    header,
    private_homes,
    restored_env,
    run_task,
    terminate_local,
    timed,
)


def _tool_versions() -> str:
    rsync = subprocess.run(["rsync", "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    ssh = subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip()
    return f"{rsync}; {ssh}"


def make_workdir(path: Path, files: int, big_mb: int) -> None:
    for i in range(files):
        sub = path / f"pkg{i % 50}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"mod{i}.py").write_text((f"value_{i} = {i}  # padding to one KiB" + " " * 20 + "\n") * 16)
    data = path / "data"
    data.mkdir(parents=True, exist_ok=True)
    for j in range(5):
        (data / f"shard{j}.bin").write_bytes(os.urandom(big_mb * 1024 * 1024 // 5))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--files", type=int, default=5000, help="small files in the workdir")
    parser.add_argument("--big-mb", type=int, default=50, help="MB of larger files in the workdir")
    parser.add_argument("--repeats", type=int, default=3, help="tries (the median is reported)")
    args = parser.parse_args()
    header(_tool_versions())
    saved_env = dict(os.environ)  # bench/run_all.py runs the next benchmark in this process
    with tempfile.TemporaryDirectory(prefix="bench-sync-") as tmp, restored_env(saved_env):
        state = Path(tmp)
        private_homes(state)
        from airflow_sky.gang.phases import register_job
        from airflow_sky.infra.base import ProvisionRequest
        from airflow_sky.infra.local.cloud import LocalCloud
        from airflow_sky.infra.registry import open_cluster
        from airflow_sky.node.client import NodeClient
        from airflow_sky.node.sync import known_hosts_line
        from airflow_sky.operators.sync import SkySyncOperator
        from airflow_sky.task import Task

        workdir = state / "workdir"
        make_workdir(workdir, args.files, args.big_mb)
        size = sum(p.stat().st_size for p in workdir.rglob("*") if p.is_file())
        print(f"workdir: {args.files} small files + 5 large, {size / 1e6:.1f} MB in all", flush=True)
        cloud = LocalCloud()
        name = "bench-sync"
        admin: list[NodeClient] = []
        try:
            nodes = cloud.provision(ProvisionRequest(name, args.nodes))
            cluster = open_cluster(name, "local")
            task = Task(name="sync", num_nodes=args.nodes, workdir=str(workdir), run="true")
            handle = register_job(cluster, task, nodes, submit_key="bench-sync")
            ops = [
                SkySyncOperator(
                    task_id=f"sync_{n.rank}", sky_task=task, cluster=handle.to_dict(), node=n.to_dict()
                )
                for n in nodes
            ]
            # The baseline's ssh: the options every OpenSSH call to a node needs (key, port, pinned host key).
            admin += [NodeClient(n, cluster.key_file) for n in nodes]
            known_hosts = state / "known_hosts"
            known_hosts.write_text("".join(known_hosts_line(c) for c in admin))
            ssh = [
                shlex.join(
                    [
                        "ssh",
                        "-i",
                        c.key_file,
                        "-p",
                        str(c.node.ssh_port),
                        "-o",
                        "BatchMode=yes",
                        "-o",
                        f"UserKnownHostsFile={known_hosts}",
                        "-o",
                        "StrictHostKeyChecking=yes",
                    ]
                )
                for c in admin
            ]

            def ours() -> None:
                with ThreadPoolExecutor(len(ops)) as pool:
                    results = list(pool.map(run_task, ops))
                assert all(r["method"] == "rsync" for r in results), results

            def baseline() -> None:
                procs = [
                    subprocess.Popen(
                        ["rsync", "-a", "-e", cmd, f"{workdir}/", f"{c.node.ssh_host}:plain_workdir/"],
                        stdout=subprocess.DEVNULL,
                    )
                    for c, cmd in zip(admin, ssh, strict=True)
                ]
                for proc in procs:
                    if proc.wait() != 0:
                        raise SystemExit(f"rsync failed ({proc.returncode})")

            def clean() -> None:
                for c in admin:
                    rc, _, err = c.exec("rm -rf ~/sky_workdir ~/plain_workdir", timeout=120)
                    assert rc == 0, err
                for c in admin:
                    c.close()

            firsts: dict[str, list[float]] = {"ours": [], "baseline": []}
            resyncs: dict[str, list[float]] = {"ours": [], "baseline": []}
            changed = workdir / "pkg3" / "mod3.py"
            for i in range(args.repeats):
                clean()
                order = [("ours", ours), ("baseline", baseline)]
                if i % 2:
                    order.reverse()  # neither side always goes first (page cache, a warm CPU)
                for label, fn in order:
                    firsts[label].append(timed(fn))
                changed.write_text(f"value = 'changed {i}'\n")
                for label, fn in order:
                    resyncs[label].append(timed(fn))
                print(
                    f"  [try {i + 1}] first: ours {firsts['ours'][-1]:.3f} s, rsync -a {firsts['baseline'][-1]:.3f} s;"
                    f" re-sync: ours {resyncs['ours'][-1]:.3f} s, rsync -a {resyncs['baseline'][-1]:.3f} s",
                    flush=True,
                )
            for label, runs in (("first sync", firsts), ("re-sync after one change", resyncs)):
                o, b = statistics.median(runs["ours"]), statistics.median(runs["baseline"])
                print(
                    f"{label:<26} {args.nodes} nodes: ours {o:6.3f} s   rsync -a {b:6.3f} s   ratio {o / b:5.2f}"
                    "   (target <= 1.20)",
                    flush=True,
                )
        finally:
            for c in admin:
                c.close()
            terminate_local(cloud, name)


if __name__ == "__main__":
    main()
