"""`airflow-sky ssh check POOL` and `airflow-sky ssh unlock POOL`: the hosts of an ssh node pool.

`check` connects to every host and prints one row each, like `sky check`: reachable, key accepted, the
tools the job layer needs (bash, rsync, python3), the GPUs nvidia-smi reports, the container runtimes
(`image_id: docker:` needs Docker with its daemon up, or Podman), and who holds the host (read from the
pool's state host, which `check` needs).
`unlock` breaks stale locks: a lock whose cluster no longer has the host (torn down while the host was
off, or replaced away from it); `--force` breaks live ones too.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich import box
from rich.text import Text

from airflow_sky.client.cli.tables import Column, fitted_table, terminal_console

if TYPE_CHECKING:
    from airflow_sky.infra.ssh.cloud import HostStatus, SshCloud
    from airflow_sky.infra.ssh.hosts import HostLock

ACTIONS = ("check", "unlock")


def run(action: str, argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog=f"airflow-sky ssh {action}")
    parser.add_argument("pool", help="the pool's name (in ssh_node_pools.yaml, or the connection's)")
    parser.add_argument("--conn-id", help="an Airflow connection of type sky_ssh_pool defining the pool")
    if action == "unlock":
        parser.add_argument("hosts", nargs="*", help="only these hosts (as the pool lists them)")
        parser.add_argument("--force", action="store_true", help="also break locks of live clusters")
    args = parser.parse_args(list(argv))
    from airflow_sky.infra.ssh.cloud import SshCloud  # imports Airflow's SSH hook: not at CLI start

    cloud = SshCloud(args.pool, conn_id=args.conn_id)
    return _check(cloud) if action == "check" else _unlock(cloud, args.hosts, args.force)


# `sky check`'s plain layout (no vertical rules); on a narrow terminal the host name is cut first, then
# PYTHON3, BASH, RSYNC, GPUS and HELD BY go in that order.
_CHECK_COLUMNS = (
    Column("#"),
    Column("HOST", name=True),
    Column("SSH"),
    Column("BASH", drop=2),
    Column("RSYNC", drop=3),
    Column("PYTHON3", drop=1),
    Column("GPUS", drop=4),
    Column("HELD BY", drop=5),
)


def _check(cloud: SshCloud) -> int:
    console = terminal_console()
    statuses = cloud.check()
    rows: list[list[str | Text]] = []
    healthy = True
    missing = Text("missing", style="red")
    for status in statuses:
        host = status.host
        facts = status.facts
        if facts is None:
            healthy = False
            rows.append([str(host.index), host.name, Text("✗ below", style="red"), *["-"] * 5])
            continue
        ok_tools = facts.bash != "-" and facts.python != "-"
        healthy = healthy and ok_tools
        rows.append(
            [
                str(host.index),
                host.name,  # as the pool lists it (an IP or an alias); the user is the pool's
                Text("✓", style="green"),
                # What the host answered is text, never markup (a lock's holder is written on the host).
                facts.bash.split("(")[0] if facts.bash != "-" else missing,
                "✓" if facts.rsync else Text("no: SFTP", style="yellow"),
                facts.python if facts.python != "-" else missing,
                facts.gpus.describe().replace("NVIDIA ", "") if facts.gpus.count else "-",
                _holder(status.lock),
            ]
        )
    table = fitted_table(
        _CHECK_COLUMNS,
        rows,
        console.width,
        title=f"ssh/{cloud.pool_name} ({cloud.pool.source})",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        padding=(0, 1, 0, 0),
    )
    console.print(table)
    for status in statuses:  # under the table, wrapped: a row of it would not hold a whole error
        if status.facts is None:
            console.print(Text(f"✗ {status.host.name}: {_short(status.error)}", style="red"))
    console.print(Text(_runtimes_line(statuses)))
    if not healthy:
        console.print("Some hosts cannot run jobs; see the rows marked ✗ or missing.")
    return 0 if healthy else 1


def _runtimes(described: str) -> str:
    """A row's share of what the host said about its runtimes (node.container.describe_runtimes): the ones
    a container can start with; Docker without its daemon only when there is no other."""
    found = [] if described.startswith("none") else described.split(", ")
    usable = [r for r in found if " " not in r]
    return ",".join(usable) if usable else "docker: no daemon" if found else "none"


def _runtimes_line(statuses: Sequence[HostStatus]) -> str:
    """One line under the table (a column would not fit 80 columns): each reachable host's runtimes."""
    by_runtime: dict[str, list[str]] = {}
    for status in statuses:
        if status.facts is not None:
            by_runtime.setdefault(_runtimes(status.containers), []).append(status.host.name)
    reached = sum(len(names) for names in by_runtime.values())
    if len(by_runtime) == 1 and reached > 1:
        return f"Container runtime (image_id: docker:): {next(iter(by_runtime))} on every host answering"
    parts = "; ".join(f"{runtime} on {', '.join(names)}" for runtime, names in by_runtime.items())
    return f"Container runtime (image_id: docker:): {parts or 'no host answered'}"


def _holder(lock: HostLock | None) -> str:
    return f"{lock.cluster} (rank {lock.rank})" if lock is not None else "free"


def _short(error: str | None) -> str:
    text = error or "unreachable"
    return text if len(text) <= 90 else text[:87] + "..."


def _unlock(cloud: SshCloud, hosts: Sequence[str], force: bool) -> int:
    broken = cloud.unlock(hosts, force=force)
    if not broken:
        print(
            f"No stale lock in ssh/{cloud.pool_name}" + (" (use --force for live ones)" if not force else "")
        )
    for host, lock in broken:
        print(f"Unlocked {host.label}: was held by {lock.describe()}")
    return 0
