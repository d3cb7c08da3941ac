"""Fan-out of one phase's SSH work over N local nodes: our start tasks vs a plain asyncssh fan-out (the floor).

    ours   SkyStartOperator.execute for every rank (what the mapped start tasks of the run phase do: the
           hook builds the Cluster, gang.phases.start_rank reads the job state, builds the rank's env,
           opens the node's connection and starts the script detached), all ranks at once on threads of
           one process, as mapped task instances run side by side under a scheduler
    floor  one asyncio process, one asyncssh connection per node, the same start command with the same
           payload (script, env file, launch.sh on stdin), all nodes at once

Each measurement runs in a fresh subprocess, so its peak RSS (VmHWM) is the fan-out process's own. Before the
clock starts, the operators are built and one start of another job runs on one node (untimed, reported apart
as "first start in a fresh process"): what a process pays once (lazy imports, Airflow's secrets masker and
logging setup) is no part of the fan-out's cost per rank. SSH connections are counted on the node side,
around the timed fan-out: every TCP connection with a node server's address at one end that appeared
(established, or already in TIME_WAIT) is one connection opened. Target: ours <= 2x the floor at 64 nodes.

Why threads in one process: under a real scheduler each mapped task instance is its own process, whose
interpreter start and imports (~2-5 s of CPU each, whatever the phase does) would swamp the SSH work on a
2-core machine; one process with one thread per rank measures exactly the per-rank code path, and its RSS is
an upper bound of what one task process holds (it holds all N ranks' connections at once).

Usage: python bench/bench_fanout.py [--sizes 1,8,32,64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import (  # bench/common.py (the script's own folder)
    header,
    private_homes,
    restored_env,
    run_task,
    terminate_local,
)

REPO = Path(__file__).resolve().parents[1]
SCRIPT = "true"


# ---- the machine ---------------------------------------------------------------------------------------


# ---- node-side connection count ----------------------------------------------------------------------


def _addr(hex_addr: str) -> tuple[str, int]:
    ip_hex, port_hex = hex_addr.split(":")
    if len(ip_hex) == 8:
        ip = socket.inet_ntop(socket.AF_INET, bytes.fromhex(ip_hex)[::-1])
    else:  # IPv6 in 4 little-endian words; an IPv4-mapped address reads as its IPv4 part
        raw = b"".join(bytes.fromhex(ip_hex[i : i + 8])[::-1] for i in range(0, 32, 8))
        ip = socket.inet_ntop(socket.AF_INET6, raw).removeprefix("::ffff:")
    return ip, int(port_hex, 16)


Conn = tuple[tuple[str, int], tuple[str, int]]  # (node server, peer)
_TIME_WAIT = "06"


def tcp_connections(servers: set[tuple[str, int]]) -> dict[Conn, set[tuple[str, float]]]:
    """Every TCP connection on this machine with a node server at one end, in any state but LISTEN, with its
    sockets as (state, when its TIME_WAIT ends): a connection closed a moment ago still shows in TIME_WAIT
    (60 s) on the side that closed first, with its time left (in 1/100 s)."""
    found: dict[Conn, set[tuple[str, float]]] = {}
    now = time.monotonic()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A":  # LISTEN
                continue
            local, remote = _addr(fields[1]), _addr(fields[2])
            if local in servers:
                key = (local, remote)
            elif remote in servers:
                key = (remote, local)
            else:
                continue
            ends = now + int(fields[5].split(":")[1], 16) / 100 if fields[3] == _TIME_WAIT else 0.0
            found.setdefault(key, set()).add((fields[3], ends))
    return found


def opened_since(
    before: dict[Conn, set[tuple[str, float]]], after: dict[Conn, set[tuple[str, float]]]
) -> list[Conn]:
    """The connections of `after` that are new since `before`: an address pair not seen before, or one seen
    only in TIME_WAIT before and in another state now. Linux reuses the address pair of a connection in
    TIME_WAIT for a new loopback connection (tcp_tw_reuse=2), and a new connection that is itself in TIME_WAIT
    by now cannot be told from the old one: the count is a lower bound; the highest count per node is what
    is reported."""
    new = []
    for key, sockets in after.items():
        old = before.get(key)
        if old is None or (
            all(state == _TIME_WAIT for state, _ in old) and any(state != _TIME_WAIT for state, _ in sockets)
        ):
            new.append(key)
    return new


def _status(field: str) -> int:
    """A memory figure of this process from /proc/self/status, in bytes (VmRSS: now; VmHWM: its peak).

    Not getrusage's ru_maxrss: that keeps the parent's peak across fork + exec.
    """
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _rss_now() -> int:
    return _status("VmRSS")


def _servers(nodes: list[dict[str, Any]]) -> set[tuple[str, int]]:
    return {(str(n["ssh_host"]), int(n["ssh_port"])) for n in nodes}


def _opened(servers: set[tuple[str, int]], before: dict[Conn, set[tuple[str, float]]]) -> list[int]:
    """Connections opened per node since `before` (sorted counts, one per node)."""
    per_node = dict.fromkeys(servers, 0)
    for server, _peer in opened_since(before, tcp_connections(servers)):
        per_node[server] += 1
    return sorted(per_node.values())


def child_ours(spec: dict[str, Any]) -> dict[str, Any]:
    from concurrent.futures import ThreadPoolExecutor

    from airflow_sky.operators.phase import SkyStartOperator
    from airflow_sky.task import Task

    task = Task.from_dict(spec["task"])

    def operator(handle: dict[str, Any], node: dict[str, Any]) -> Any:
        return SkyStartOperator(
            task_id=f"start_{node['rank']}", sky_task=task, cluster=handle, node=node, phase="run"
        )

    # One start of another job first, untimed: what the first call in a process pays once (lazy imports,
    # Airflow's secrets masker and logging) is no part of the fan-out's cost per rank.
    warm = spec["warm_handle"]
    cold_started = time.perf_counter()
    run_task(operator(warm, warm["nodes"][0]))
    cold = time.perf_counter() - cold_started
    nodes = spec["handle"]["nodes"]
    ops = [operator(spec["handle"], node) for node in nodes]
    servers = _servers(nodes)
    rss_before = _rss_now()
    before = tcp_connections(servers)
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=spec["workers"] or len(ops)) as pool:
        results = list(pool.map(run_task, ops))
    elapsed = time.perf_counter() - started
    conns = _opened(servers, before)
    bad = [r for r in results if not r.get("started")]
    if bad:
        raise SystemExit(f"ours: not started: {bad}")
    return {"elapsed": elapsed, "cold": cold, "rss_before": rss_before, "conns": conns}


def child_floor(spec: dict[str, Any]) -> dict[str, Any]:
    import asyncio

    import asyncssh

    from airflow_sky.node import shell

    key = asyncssh.read_private_key(spec["key_file"])
    payloads = {int(rank): Path(path).read_bytes() for rank, path in spec["payloads"].items()}

    async def one(node: dict[str, Any], job_id: str) -> str:
        known = asyncssh.import_known_hosts(f"[{node['ssh_host']}]:{node['ssh_port']} {node['host_key']}\n")
        async with asyncssh.connect(
            node["ssh_host"],
            node["ssh_port"],
            username=node["ssh_user"],
            client_keys=[key],
            known_hosts=known,
            agent_path=None,
            config=None,
        ) as conn:
            result = await conn.run(
                shell.start_command(job_id, 0), input=payloads[node["rank"]], encoding=None
            )
        if result.exit_status != 0:
            raise SystemExit(f"floor: rank {node['rank']}: {result.stderr!r}")
        return bytes(result.stdout).decode().strip().splitlines()[-1]

    async def fan_out(nodes: list[dict[str, Any]], job_id: str) -> list[str]:
        return await asyncio.gather(*(one(node, job_id) for node in nodes))

    nodes = spec["nodes"]
    cold_started = time.perf_counter()
    asyncio.run(fan_out(nodes[:1], spec["warm_job_id"]))  # untimed, as ours
    cold = time.perf_counter() - cold_started
    servers = _servers(nodes)
    rss_before = _rss_now()
    before = tcp_connections(servers)
    started = time.perf_counter()
    outs = asyncio.run(fan_out(nodes, spec["job_id"]))
    elapsed = time.perf_counter() - started
    conns = _opened(servers, before)
    if not all(o.startswith("started") for o in outs):
        raise SystemExit(f"floor: not started: {outs}")
    return {"elapsed": elapsed, "cold": cold, "rss_before": rss_before, "conns": conns}


def child(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    result = child_ours(spec) if spec["mode"] == "ours" else child_floor(spec)
    result["maxrss"] = _status("VmHWM")
    print("RESULT " + json.dumps(result), flush=True)


# ---- the parent --------------------------------------------------------------------------------------


def _tar(files: dict[str, tuple[bytes, int]]) -> bytes:
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, (data, mode) in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def measure(spec: dict[str, Any], state: Path) -> dict[str, Any]:
    spec_path = state / f"spec-{spec['mode']}.json"
    spec_path.write_text(json.dumps(spec))
    proc = subprocess.run(
        [sys.executable, __file__, "--child", str(spec_path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(
            f"{spec['mode']} failed ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
        )
    result: dict[str, Any] = json.loads(lines[-1].removeprefix("RESULT "))
    return result


def _payload(cluster: Any, task: Any, handle: Any, rank: int) -> bytes:
    """What our start sends on stdin for `rank` (jobs.start_job): the script, the env file, launch.sh."""
    from airflow_sky.gang.phases import phase_env
    from airflow_sky.node import shell
    from airflow_sky.task import envs

    env = phase_env(cluster, task, handle, "run", rank)
    return _tar(
        {
            "script.sh": (SCRIPT.encode(), 0o700),
            "env": (envs.env_file_text(env).encode(), 0o600),
            "launch.sh": (shell.launch_script().encode(), 0o700),
        }
    )


def bench_size(cluster: Any, nodes: list[Any], n: int, repeats: int, workers: int, state: Path) -> float:
    from airflow_sky.gang.phases import register_job
    from airflow_sky.task import Task

    use = nodes[:n]
    task = Task(name="fanout", num_nodes=n, run=SCRIPT)
    runs: dict[str, list[dict[str, Any]]] = {"ours": [], "floor": []}
    for i in range(repeats):
        handle = register_job(cluster, task, use, submit_key=f"fanout-{n}-{i}")
        warm = register_job(cluster, task, use, submit_key=f"fanout-{n}-{i}-warm")
        payloads = {}
        for node in use:
            path = state / f"payload-{node.rank}"
            path.write_bytes(_payload(cluster, task, handle, node.rank))
            payloads[str(node.rank)] = str(path)
        specs = {
            "ours": {
                "mode": "ours",
                "task": task.to_dict(),
                "handle": handle.to_dict(),
                "warm_handle": warm.to_dict(nodes=True),
                "workers": workers,
            },
            "floor": {
                "mode": "floor",
                "nodes": [node.to_dict() for node in use],
                "key_file": cluster.key_file,
                "job_id": f"floor-{handle.job_id}-run",
                "warm_job_id": f"floor-{warm.job_id}-run",
                "payloads": payloads,
            },
        }
        order = ["ours", "floor"] if i % 2 == 0 else ["floor", "ours"]  # neither side always goes first
        for mode in order:
            runs[mode].append(measure(specs[mode], state))
        print(
            f"  [{n} nodes, try {i + 1}] ours {runs['ours'][-1]['elapsed']:.3f} s, "
            f"floor {runs['floor'][-1]['elapsed']:.3f} s",
            flush=True,
        )
    o = statistics.median(r["elapsed"] for r in runs["ours"])
    f = statistics.median(r["elapsed"] for r in runs["floor"])
    mib = 1024 * 1024

    def conns(mode: str) -> str:
        every = [c for r in runs[mode] for c in r["conns"]]
        return f"{min(every)}-{max(every)}" if min(every) != max(every) else str(every[0])

    def rss(mode: str) -> str:
        peak = max(r["maxrss"] for r in runs[mode]) / mib
        before = max(r["rss_before"] for r in runs[mode]) / mib
        return f"{peak:.0f} MiB ({before:.0f} MiB before the fan-out)"

    cold_o = statistics.median(r["cold"] for r in runs["ours"])
    cold_f = statistics.median(r["cold"] for r in runs["floor"])
    print(
        f"{n:3d} nodes: ours {o:6.3f} s   floor {f:6.3f} s   ratio {o / f:5.2f}"
        + ("   (target <= 2.00)" if n == 64 else "")
        + f"\n    SSH connections opened per node in the phase: ours {conns('ours')}, floor {conns('floor')}"
        + f"\n    peak RSS of the fan-out process: ours {rss('ours')}, floor {rss('floor')}"
        + f"\n    first start in a fresh process (one node, untimed above): ours {cold_o:.3f} s, floor {cold_f:.3f} s",
        flush=True,
    )
    return o / f


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="1,8,32,64", help="node counts (comma-separated)")
    parser.add_argument("--repeats", type=int, default=3, help="tries per size (the median is reported)")
    parser.add_argument(
        "--workers", type=int, default=0, help="threads for our start tasks (0: one per rank)"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    header()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    saved_env = dict(os.environ)  # bench/run_all.py runs the next benchmark in this process
    with tempfile.TemporaryDirectory(prefix="bench-fanout-") as tmp, restored_env(saved_env):
        state = Path(tmp)
        private_homes(state)  # the child processes inherit it
        from airflow_sky.infra.base import ProvisionRequest
        from airflow_sky.infra.local.cloud import LocalCloud
        from airflow_sky.infra.registry import open_cluster

        cloud = LocalCloud()
        name = "bench-fanout"
        try:
            started = time.perf_counter()
            nodes = cloud.provision(ProvisionRequest(name, max(sizes)))
            print(f"{len(nodes)} local nodes up in {time.perf_counter() - started:.1f} s", flush=True)
            cluster = open_cluster(name, "local")
            for n in sizes:
                bench_size(cluster, nodes, n, args.repeats, args.workers, state)
        finally:
            terminate_local(cloud, name)


if __name__ == "__main__":
    main()
