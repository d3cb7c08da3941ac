"""What the ssh infra does on a pool's hosts: probe them and clean them at teardown; the lock record.

A host is held for a cluster by a lock naming the cluster, the rank and a token. The lock is kept on the
pool's state host (host_locks.py), never on the host itself: a job there could delete or forge it. What a
probe reads from a host (tools, addresses, GPUs) is the host's answer, used to pick hosts, never to decide
who holds one. Shell text comes from the pure functions below.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import shlex
import socket
import time
from collections.abc import Sequence
from typing import Any

from airflow_sky.errors import RemoteError
from airflow_sky.infra.gpus import QUERY_COMMAND, Gpus, parse_nvidia_smi
from airflow_sky.node.client import NodeClient
from airflow_sky.node.container import LABEL, describe_runtimes, remove_command
from airflow_sky.node.paths import JOBS_DIR
from airflow_sky.node.processes import sweep_user_command

_DOCKER_BRIDGE = ipaddress.ip_network("172.17.0.0/16")  # docker0: never how other hosts reach this one
_GPU_MARKER = "--- gpus ---"


@dataclasses.dataclass(frozen=True)
class HostLock:
    """Who holds a host: the cluster, the rank it gave the host, and the token of that allocation."""

    cluster: str
    rank: int
    pool: str
    token: str
    locked_at: float = 0.0
    locked_by: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HostLock | None:
        """The lock a record holds; None for a free host's (empty) record."""
        if not data:
            return None
        try:
            return cls(
                cluster=str(data["cluster"]),
                rank=int(data["rank"]),
                pool=str(data.get("pool", "")),
                token=str(data["token"]),
                locked_at=float(data.get("locked_at") or 0.0),
                locked_by=str(data.get("locked_by") or ""),
            )
        except (ValueError, KeyError, TypeError):
            return None

    def describe(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M", time.localtime(self.locked_at)) if self.locked_at else "?"
        return f"cluster {self.cluster!r} (rank {self.rank}, since {since})"


def new_lock(cluster: str, rank: int, pool: str, token: str) -> HostLock:
    return HostLock(cluster, rank, pool, token, time.time(), socket.gethostname())


@dataclasses.dataclass(frozen=True)
class HostFacts:
    """What a probe learned about a host."""

    bash: str
    rsync: bool
    python: str
    gpus: Gpus
    addresses: tuple[str, ...] = ()  # what `hostname -I` lists


# ---- shell text (pure) -------------------------------------------------------------------------------


def probe_command() -> str:
    """One exec: the tools the job layer needs, the host's addresses, and nvidia-smi's view of the GPUs."""
    return f"""\
printf 'bash %s\\n' "${{BASH_VERSION:--}}"
printf 'rsync %s\\n' "$(command -v rsync >/dev/null 2>&1 && echo 1 || echo 0)"
printf 'addrs %s\\n' "$(hostname -I 2>/dev/null || true)"
printf 'python %s\\n' "$(python3 -c 'import platform; print(platform.python_version())' 2>/dev/null || echo -)"
echo {shlex.quote(_GPU_MARKER)}
{QUERY_COMMAND} || true
"""


def parse_probe(output: str) -> HostFacts:
    head, _, gpu_text = output.partition(_GPU_MARKER + "\n")
    values: dict[str, str] = {}
    for line in head.splitlines():
        key, _, value = line.partition(" ")
        values[key] = value.strip()
    return HostFacts(
        bash=values.get("bash", "-"),
        rsync=values.get("rsync") == "1",
        python=values.get("python", "-"),
        gpus=parse_nvidia_smi(gpu_text),
        addresses=tuple(values.get("addrs", "").split()),
    )


def internal_ip(pool_address: str, host_addresses: tuple[str, ...]) -> str:
    """The address the other nodes reach this host at, for SKYPILOT_NODE_IPS.

    A private (or loopback) address in the pool is the cluster network already. A public one is how this
    client reaches the host, not how the hosts talk to each other: then the host's own first private
    IPv4 address (`hostname -I`) is the one, as a cloud's internal IP would be; failing that, the pool's.
    """
    try:
        address = ipaddress.ip_address(pool_address)
    except ValueError:
        return pool_address
    if address.is_private or address.is_loopback:
        return pool_address
    for candidate in host_addresses:
        try:
            own = ipaddress.ip_address(candidate)
        except ValueError:
            continue
        if (
            own.version == 4
            and own.is_private
            and not own.is_loopback
            and not own.is_link_local
            and own not in _DOCKER_BRIDGE  # docker0 on the host: not reachable from other hosts
        ):
            return candidate
    return pool_address


def clean_command(spare_sessions: bool = True) -> str:
    """Stop everything the cluster's jobs left on the host (the login user's processes outside SSH sessions,
    setsid or not: node.processes.sweep_user_command; the host was the cluster's alone) and remove the job
    records. `spare_sessions=False` ends the user's other SSH sessions too (login_baseline.py's reset,
    which also puts the login files and the home back as they were).
    """
    return f"""\
{sweep_user_command(spare_sessions=spare_sessions)}
rm -rf -- "$HOME"/{JOBS_DIR}
"""


def remove_containers_command(names: Sequence[str] = ()) -> str:
    """Shell that removes the node containers (`image_id: docker:`) of the login user before the host
    changes hands: `names` (the allocation's, node.container.container_name), then every container a node
    of this user left: with rootless Podman all of the user's (the host was the cluster's alone, and they
    live in the user's own storage), with Docker's shared daemon (or as root) those labelled as a node's that
    bind this user's home. Run before the process sweep: a container removed by its runtime leaves no
    record behind, where one whose conmon/catatonit were killed stays listed, half alive."""
    return f"""\
{remove_command(names)}
for rt in docker podman; do
  command -v "$rt" >/dev/null 2>&1 || continue
  [ "$rt" = docker ] && ! timeout 20 docker info >/dev/null 2>&1 && continue
  if [ "$rt" = podman ] && [ "$(id -u)" != 0 ]; then
    timeout 180 podman rm -af -t 2 >/dev/null 2>&1 || true
    continue
  fi
  left=$(timeout 60 "$rt" ps -aq --filter label={shlex.quote(LABEL)} --filter volume="$HOME" 2>/dev/null)
  [ -n "$left" ] && {{ timeout 180 "$rt" rm -f $left >/dev/null 2>&1 || true; }}
done
true
"""


def _runtime_probes() -> list[str]:
    """The commands node.container.describe_runtimes runs on a machine (asked with every answer yes)."""
    asked: list[str] = []

    def ask(command: str) -> bool:
        asked.append(command)
        return True

    describe_runtimes(ask)
    return asked


def containers_probe_command() -> str:
    """One exec: each of describe_runtimes' probes, answered as `rt <n> 0|1` lines."""
    return "".join(
        f"if {probe}; then echo 'rt {i} 1'; else echo 'rt {i} 0'; fi\n"
        for i, probe in enumerate(_runtime_probes())
    )


def parse_containers_probe(output: str) -> str:
    """What `check` says about the host's runtimes (node.container.describe_runtimes' words)."""
    said = dict(
        line.split()[1:3] for line in output.splitlines() if len(line.split()) == 3 and line.startswith("rt ")
    )
    answers = {probe: said.get(str(i)) == "1" for i, probe in enumerate(_runtime_probes())}
    return describe_runtimes(lambda probe: answers.get(probe, False))


def unusable_reason(e: Exception) -> str:
    """Why a host cannot be used, in the words a user acts on."""
    text = str(e)
    if text.startswith("cannot reach node") and ": " in text:
        text = text.split(": ", 1)[1]
    if "Authentication failed" in text:
        return "the host refused the key (identity_file) for this user"
    if "does not match" in text or "presented host key" in text:
        return (
            "its host key does not match the one the pool pins (the host's `host_key`, or its known_hosts "
            "line): a reinstalled host, or someone in between; check it, then replace the pinned key"
        )
    return text


# ---- over SSH ----------------------------------------------------------------------------------------


def probe(client: NodeClient) -> HostFacts:
    _rc, out, _err = client.exec(probe_command(), timeout=30)
    return parse_probe(out.decode(errors="replace"))


def clean(client: NodeClient, containers: Sequence[str] = ()) -> None:
    remove_containers(client, containers)
    client.exec(clean_command(), timeout=60)


def remove_containers(client: NodeClient, names: Sequence[str] = ()) -> None:
    """The user's node containers removed (remove_containers_command); best effort: the sweep follows."""
    with contextlib.suppress(RemoteError):
        client.exec(remove_containers_command(names), timeout=600, purpose="the host's containers")


def containers(client: NodeClient) -> str:
    _rc, out, _err = client.exec(containers_probe_command(), timeout=60)
    return parse_containers_probe(out.decode(errors="replace"))
