"""Bucket COPY to 4 local nodes: what our sync tasks do for a COPY file_mount vs `rclone copy` typed by hand.

    bucket   2,000 objects of 32 KiB (random bytes: a dataset shard) under `shard/` in a bucket of moto's S3
             server on loopback (tests/s3server.py: it counts the object bytes served to rclone and to
             anything else, the Airflow worker)
    ours     for each node, on its own thread (the sync tasks of a DAG run side by side): the bucket plan
             from the Airflow `aws` connection (bucket_remotes, as the sync task's hook.bucket_plan), a new
             SSH connection to the node, node.buckets.attach_buckets (the config uploaded on the channel's
             stdin, rclone copyto on the node, the summary line), the connection closed
    by hand  `ssh node 'cat > conf && rclone copy sky-s3:bucket/shard ~/plain_data --config conf'`, the same
             config text on stdin, one per node, all at once: with rclone's defaults (what a user typing it
             gets: --transfers 4 --checkers 8) and with our flags (--transfers 16 --checkers 16 --fast-list)

Every run copies into fresh destinations (removed before each round). One untimed warm-up of each side
first (rclone's binary, moto's listing, the aws provider's imports), then --repeats rounds in a rotating
order; each figure is the median. Target: ours <= 1.2x rclone by hand with its defaults, and 0 object bytes
served to the worker.

Usage: python bench/bench_buckets.py [--nodes 4] [--objects 2000] [--object-kb 32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests/s3server.py: moto's S3 with a byte counter per client kind

from common import header, private_homes, restored_env, terminate_local, timed  # noqa: E402  # bench/common.py

from tests.s3server import S3Server  # noqa: E402

BUCKET = "bench-copy"
DEST = "~/data"
PLAIN = "plain_data"  # the by-hand copies' destinations (one per variant) and config, under the node's home
PLAIN_CONF = ".rclone-by-hand.conf"


def _tool_versions() -> str:
    rclone = subprocess.run(["rclone", "version"], capture_output=True, text=True).stdout.split("\n")[0]
    ssh = subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip()
    return f"{rclone}; {ssh}"


def fill_bucket(s3: S3Server, objects: int, size: int) -> None:
    client = s3.client
    client.create_bucket(Bucket=BUCKET)

    def put(i: int) -> None:
        client.put_object(Bucket=BUCKET, Key=f"shard/{i // 100:03d}/obj-{i:05d}.bin", Body=os.urandom(size))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, range(objects)))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--objects", type=int, default=2000, help="objects in the bucket")
    parser.add_argument("--object-kb", type=int, default=32, help="KiB per object")
    parser.add_argument("--repeats", type=int, default=3, help="rounds (the median is reported)")
    args = parser.parse_args()
    header(_tool_versions())
    saved_env = dict(os.environ)  # bench/run_all.py runs the next benchmark in this process
    with (
        tempfile.TemporaryDirectory(prefix="bench-buckets-") as tmp,
        restored_env(saved_env),
        S3Server() as s3,
    ):
        state = Path(tmp)
        private_homes(state)
        os.environ["AIRFLOW_CONN_AWS_DEFAULT"] = s3.connection
        from airflow_sky.infra.base import ProvisionRequest
        from airflow_sky.infra.local.cloud import LocalCloud
        from airflow_sky.infra.registry import open_cluster
        from airflow_sky.node import rclone
        from airflow_sky.node.buckets import attach_buckets, bucket_remotes
        from airflow_sky.node.client import NodeClient
        from airflow_sky.node.sync import known_hosts_line, ssh_command_for
        from airflow_sky.task import Task
        from airflow_sky.task.storage import COPY, bucket_mounts

        size = args.object_kb * 1024
        fill_bucket(s3, args.objects, size)
        per_node = args.objects * size
        print(f"bucket: {args.objects} objects of {args.object_kb} KiB, {per_node / 1e6:.1f} MB", flush=True)
        task = Task(name="copy", num_nodes=args.nodes, run="true", file_mounts={DEST: f"s3://{BUCKET}/shard"})
        mounts = bucket_mounts(task)
        assert [m.mode for m in mounts] == [COPY], mounts
        cloud = LocalCloud()
        name = "bench-buckets"
        admin: list[NodeClient] = []
        try:
            nodes = cloud.provision(ProvisionRequest(name, args.nodes))
            cluster = open_cluster(name, "local")
            admin += [NodeClient(n, cluster.key_file) for n in nodes]
            known_hosts = state / "known_hosts"
            known_hosts.write_text("".join(known_hosts_line(c) for c in admin))
            ssh = [[*ssh_command_for(c, known_hosts), c.node.ssh_host] for c in admin]
            # The config a user would write by hand: the same text as ours (same remote, same credentials).
            config = rclone.config_text(bucket_remotes(mounts, "aws_default").remotes).encode()

            planning: list[float] = []  # per run of ours: the slowest node's bucket_remotes

            def ours() -> None:
                def one(node: Any) -> tuple[int, float]:
                    started = time.perf_counter()
                    plan = bucket_remotes(mounts, "aws_default")  # the sync task's hook.bucket_plan
                    planned = time.perf_counter() - started
                    with NodeClient(node, cluster.key_file) as client:
                        return attach_buckets(client, plan, lambda line: None), planned

                with ThreadPoolExecutor(len(nodes)) as pool:
                    results = list(pool.map(one, nodes))
                assert [copied for copied, _ in results] == [args.objects] * len(nodes), results
                planning.append(max(planned for _, planned in results))

            def by_hand(dest: str, flags: list[str]) -> Callable[[], None]:
                copy = shlex.join(["rclone", "copy", f"sky-s3:{BUCKET}/shard", dest, "--config", PLAIN_CONF])
                command = f"umask 077 && cat > {PLAIN_CONF} && {copy} {shlex.join(flags)}".strip()

                def run() -> None:
                    procs = [
                        subprocess.Popen([*cmd, command], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
                        for cmd in ssh
                    ]
                    for proc in procs:
                        proc.communicate(config)
                        if proc.returncode != 0:
                            raise SystemExit(f"rclone copy by hand failed ({proc.returncode})")

                return run

            def clean() -> None:
                for c in admin:
                    rc, _, err = c.exec(
                        f"rm -rf {DEST} ~/{PLAIN}-* ~/{PLAIN_CONF} ~/.airflow_sky/mounts", timeout=120
                    )
                    assert rc == 0, err
                for c in admin:
                    c.close()  # ours opens its own connections, inside the timing

            n = str(rclone.COPY_TRANSFERS)
            our_flags = ["--transfers", n, "--checkers", n, "--fast-list"]  # what sky_copy adds
            sides: list[tuple[str, Callable[[], None]]] = [
                ("ours", ours),
                ("defaults", by_hand(f"{PLAIN}-defaults", [])),
                ("our flags", by_hand(f"{PLAIN}-flags", our_flags)),
            ]
            times: dict[str, list[float]] = {label: [] for label, _ in sides}
            served: dict[str, dict[str, int]] = {label: {"rclone": 0, "worker": 0} for label, _ in sides}
            clean()
            for _, fn in sides:
                fn()  # warm-up, untimed
            for i in range(args.repeats):
                clean()
                order = sides[i % len(sides) :] + sides[: i % len(sides)]  # each side first in turn
                for label, fn in order:
                    s3.counts.reset()
                    times[label].append(timed(fn))
                    served[label]["rclone"] += s3.counts.bytes["rclone"]
                    served[label]["worker"] += s3.counts.bytes["worker"]
                print(
                    f"  [round {i + 1}] ours {times['ours'][-1]:.3f} s, rclone by hand"
                    f" {times['defaults'][-1]:.3f} s (defaults), {times['our flags'][-1]:.3f} s (our flags)",
                    flush=True,
                )
            o, d, f = (statistics.median(times[k]) for k in ("ours", "defaults", "our flags"))
            what = f"copy {args.objects} objects to {args.nodes} nodes"
            print(
                f"{what}: airflow-sky {o:6.3f} s   rclone by hand {d:6.3f} s   ratio {o / d:5.2f}   (target <= 1.20)",
                flush=True,
            )
            print(
                f"{what}: airflow-sky {o:6.3f} s   rclone by hand with our flags {f:6.3f} s   ratio {o / f:5.2f}",
                flush=True,
            )
            print(
                f"    of ours: the bucket plan from the connection (bucket_remotes) {statistics.median(planning):.3f} s"
                f" on the slowest of {args.nodes} threads",
                flush=True,
            )
            expected = args.repeats * args.nodes * per_node
            print(
                "    object bytes served to the worker: "
                + ", ".join(f"{count['worker']} ({label})" for label, count in served.items())
                + f"; to rclone on the nodes {expected / args.repeats / 1e6:.1f} MB per run expected, got "
                + ", ".join(f"{count['rclone'] / args.repeats / 1e6:.1f}" for count in served.values()),
                flush=True,
            )
            if served["ours"]["worker"] or any(count["rclone"] != expected for count in served.values()):
                raise SystemExit(
                    "an object went through the worker, or a node did not fetch every object once"
                )
        finally:
            for c in admin:
                c.close()
            terminate_local(cloud, name)


if __name__ == "__main__":
    main()
