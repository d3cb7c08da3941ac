"""SSH node pools: SkyPilot's `ssh_node_pools.yaml`, read as it is, or an Airflow connection per pool.

    my-box:                       # a pool, selected with `infra: ssh/my-box`
      user: ubuntu                # optional defaults for every host of the pool
      identity_file: ~/.ssh/id_rsa
      password: ...               # SkyPilot's, for sudo: accepted, never used (nothing here needs root)
      state:                      # ours: where the pool's job records live, a host/user that runs no jobs
        host: 192.168.1.5         # an IP or an alias; `user`, `port`, `identity_file`, `host_key` optional
        user: skystate
      hosts:                      # required, non-empty; rank = position among the hosts handed out
        - 192.168.1.10            # an IP, or an alias from ~/.ssh/config (its HostName, Port, User, IdentityFile)
        - ip: 192.168.1.11        # or a mapping: `ip` required, the defaults above overridable
          user: admin
          host_key: ssh-ed25519 AAAA...   # ours: the host's pinned key (else known_hosts has it)

Files searched, first hit wins: $AIRFLOW_SKY_SSH_NODE_POOLS (only that file when set), then
`~/.airflow_sky/ssh_node_pools.yaml` (ours), then SkyPilot's `~/.sky/ssh_node_pools.yaml`.
Every error names the file, the pool, the host index and the field.
"""

from __future__ import annotations

import dataclasses
import getpass
import ipaddress
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_sky.errors import SpecError
from airflow_sky.infra.home import sky_home, user_ssh_config
from airflow_sky.task.diagnostics import show, unknown_field_message
from airflow_sky.task.yaml_io import parse_yaml

if TYPE_CHECKING:
    import paramiko

POOL_FILE_ENV = "AIRFLOW_SKY_SSH_NODE_POOLS"
POOL_FIELDS = ("user", "identity_file", "password", "hosts", "state")
HOST_FIELDS = ("ip", "user", "identity_file", "password", "host_key")
STATE_FIELDS = ("host", "user", "port", "identity_file", "host_key")
HOST_KEY_TYPES = (
    "ssh-ed25519",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "ssh-rsa",
)
# The keys OpenSSH tries when neither the pool nor ~/.ssh/config names one.
_DEFAULT_KEYS = ("~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa")


@dataclasses.dataclass(frozen=True)
class PoolHost:
    """One host of a pool, resolved: where to connect, as whom, with which key."""

    index: int  # position in the pool's `hosts` (allocation order)
    name: str  # as written in the pool (an IP or an ssh-config alias)
    address: str  # what to connect to (the alias's HostName)
    port: int
    user: str
    identity_file: str | None  # None only for a connection pool that carries its key
    password: str | None = dataclasses.field(default=None, repr=False)
    host_key: str | None = None  # `<type> <base64>` pinned in the pool definition (else known_hosts)

    @property
    def field(self) -> str:
        """Where the pool definition names the host: `hosts[i]`, or `state` for the state host."""
        return f"hosts[{self.index}]" if self.index >= 0 else "state"

    @property
    def label(self) -> str:
        """How messages and locks name the host: `user@address` (`:port` when not 22)."""
        port = "" if self.port == 22 else f":{self.port}"
        return f"{self.user}@{self.address}{port}"

    @property
    def known_hosts_name(self) -> str:
        """The host as known_hosts names it (`[address]:port` off port 22)."""
        return self.address if self.port == 22 else f"[{self.address}]:{self.port}"


@dataclasses.dataclass(frozen=True)
class Pool:
    """A named pool of hosts and where it was defined (for messages)."""

    name: str
    source: str
    hosts: tuple[PoolHost, ...]
    # From an Airflow connection: the key itself and pinned host keys (`[host]:port type base64` lines).
    private_key: str | None = dataclasses.field(default=None, repr=False)
    known_hosts: tuple[str, ...] = ()
    # Where the job records live (a host/user that runs no jobs); None: not given (refused when needed).
    state: PoolHost | None = None
    state_field: str = "state"  # how the definition names it (`extra.state` in a connection)

    def host(self, label: str) -> PoolHost | None:
        return next((h for h in self.hosts if h.label == label), None)


def pool_files() -> list[Path]:
    """The files searched for pools, in order."""
    configured = os.environ.get(POOL_FILE_ENV)
    if configured:
        return [Path(configured).expanduser()]
    return [sky_home() / "ssh_node_pools.yaml", Path.home() / ".sky" / "ssh_node_pools.yaml"]


def load_pool(name: str, files: Sequence[Path] | None = None) -> Pool:
    """Pool `name` from the first file that defines it; a clear error listing the pools that exist."""
    searched = list(files) if files is not None else pool_files()
    known: dict[str, Path] = {}
    for path in searched:
        if not path.is_file():
            continue
        pools = read_pool_file(path)
        if name in pools:
            return parse_pool(name, pools[name], str(path))
        known.update({pool: path for pool in pools if pool not in known})
    where = ", ".join(str(p) for p in searched)
    available = f"; pools defined: {', '.join(sorted(known))}" if known else ""
    raise SpecError(
        f"infra: ssh pool {name!r} is not defined in {where}{available}. Add it to one of these files "
        f"(SkyPilot's ssh_node_pools.yaml format), select a file with --pool-file or ${POOL_FILE_ENV}, "
        "or pass conn_id= naming an Airflow connection of type 'sky_ssh_pool'"
    )


def read_pool_file(path: Path) -> dict[str, Any]:
    """The raw pools of one file (top-level mapping of pool name -> pool)."""
    try:
        text = path.read_text()
    except OSError as e:
        raise SpecError(f"{path}: cannot read the pool file: {e.strerror or e}") from e
    data = parse_yaml(text, str(path))
    if data in (None, {}):
        return {}
    if not isinstance(data, dict):
        raise SpecError(f"{path}: a pool file is a mapping of pool names to pools, got {show(data)}")
    for pool_name in data:
        if not isinstance(pool_name, str):
            raise SpecError(f"{path}: pool names are strings, got {show(pool_name)}")
    return data


def parse_pool(
    name: str, raw: Any, source: str, ssh_config_path: Path | None = None, default_port: int = 22
) -> Pool:
    """Validate one pool's mapping and resolve each host (aliases through ~/.ssh/config)."""
    where = f"{source}: pool {name!r}"
    if not isinstance(raw, dict):
        raise SpecError(
            f"{where}: a pool is a mapping with `hosts` and optional {', '.join(POOL_FIELDS[:3])}"
        )
    for key in raw:
        if key not in POOL_FIELDS:
            raise SpecError(f"{where}: {key}: {unknown_field_message(key, POOL_FIELDS)}")
    defaults = {k: _string_field(raw, k, where) for k in ("user", "identity_file", "password")}
    hosts = raw.get("hosts")
    if not isinstance(hosts, list) or not hosts:
        raise SpecError(
            f"{where}: hosts: required, a non-empty list of IPs, ssh-config aliases or mappings with `ip`; "
            f"got {show(hosts)}"
        )
    config = _ssh_config(ssh_config_path)
    resolved = tuple(
        _parse_host(index, entry, defaults, f"{where}: hosts[{index}]", config, default_port)
        for index, entry in enumerate(hosts)
    )
    seen: dict[str, int] = {}
    for host in resolved:
        if host.label in seen:
            raise SpecError(
                f"{where}: hosts[{host.index}]: {host.label} is listed twice (also hosts[{seen[host.label]}])"
            )
        seen[host.label] = host.index
    state = _parse_state(raw.get("state"), defaults, where, config, default_port)
    if state is not None:
        shared = next((h for h in resolved if (h.address, h.user) == (state.address, state.user)), None)
        if shared is not None:
            raise SpecError(
                f"{where}: state: {state.user}@{state.address} is also {shared.field}, which runs jobs (a job "
                "there could rewrite the records); name a user the jobs do not run as (another account on "
                "that machine) or another machine"
            )
    return Pool(name=name, source=source, hosts=resolved, state=state)


def _parse_state(
    raw: Any,
    defaults: Mapping[str, str | None],
    where: str,
    config: paramiko.SSHConfig,
    default_port: int,
) -> PoolHost | None:
    """The pool's state host: a mapping `{host, user, port, identity_file, host_key}` (`host` required)."""
    if raw is None:
        return None
    where = f"{where}: state"
    if not isinstance(raw, dict) or "host" not in raw:
        raise SpecError(
            f"{where}: must be a mapping with `host` (an IP or ssh-config alias of a host/user that runs no "
            f"jobs) and optional {', '.join(STATE_FIELDS[1:])}; got {show(raw)}"
        )
    for key in raw:
        if key not in STATE_FIELDS:
            raise SpecError(f"{where}: {key}: {unknown_field_message(key, STATE_FIELDS)}")
    name = raw["host"]
    if not isinstance(name, str) or not name.strip() or any(c.isspace() for c in name.strip()):
        raise SpecError(
            f"{where}: host: must be an IP or an ssh-config alias without spaces, got {show(name)}"
        )
    port = raw.get("port")
    if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536):
        raise SpecError(f"{where}: port: must be a TCP port number (1-65535), got {show(port)}")
    entry = {"ip": name, **{k: raw[k] for k in ("user", "identity_file", "host_key") if k in raw}}
    host = _parse_host(-1, entry, defaults, where, config, default_port)
    return dataclasses.replace(host, port=port) if port is not None else host


def state_host(pool: Pool) -> PoolHost:
    """The pool's state host; a pool that names none is refused (its records must not sit on a job host)."""
    if pool.state is not None:
        return pool.state
    raise SpecError(
        f"{pool.source}: pool {pool.name!r}: {pool.state_field}: required. The pool's job records (which host "
        "holds which rank, the job state) live on a host/user that runs no jobs: a job on a pool host can "
        f"rewrite anything in that user's home. Add `{pool.state_field}: {{host: <IP or alias>, user: <an "
        "account the jobs do not run as>}` (docs/infra-ssh.md, 'Where the state lives'); records an older "
        f"airflow-sky kept on {pool.hosts[0].label} are not read"
    )


def _string_field(raw: Mapping[str, Any], key: str, where: str) -> str | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        shown = "a value" if key == "password" else show(value)  # never echo a password
        raise SpecError(f"{where}: {key}: must be a non-empty string, got {shown}")
    return value


def _parse_host(
    index: int,
    entry: Any,
    defaults: Mapping[str, str | None],
    where: str,
    config: paramiko.SSHConfig,
    default_port: int = 22,
) -> PoolHost:
    if isinstance(entry, str):
        fields: dict[str, str | None] = {"ip": entry}
    elif isinstance(entry, dict):
        for key in entry:
            if key not in HOST_FIELDS:
                raise SpecError(f"{where}: {key}: {unknown_field_message(key, HOST_FIELDS)}")
        if "ip" not in entry:
            raise SpecError(f"{where}: ip: required in a host mapping (an IP or an ssh-config alias)")
        fields = {k: _string_field(entry, k, where) for k in HOST_FIELDS}
    else:
        raise SpecError(
            f"{where}: a host is an IP, an ssh-config alias or a mapping with `ip`, got {show(entry)}"
        )
    name = (fields["ip"] or "").strip()
    if not name or any(c.isspace() for c in name):
        raise SpecError(f"{where}: ip: must be an IP or an ssh-config alias without spaces, got {show(name)}")
    alias = config.lookup(name)  # a name no Host stanza matches comes back as itself
    address = str(alias.get("hostname", name))
    try:
        port = int(alias.get("port", default_port))
    except ValueError as e:
        raise SpecError(f"{where}: ~/.ssh/config gives {name!r} an invalid Port {alias.get('port')!r}") from e
    user = fields.get("user") or defaults.get("user") or alias.get("user") or getpass.getuser()
    identity = fields.get("identity_file") or defaults.get("identity_file")
    field = "identity_file"
    if identity is None and alias.get("identityfile"):
        identity, field = alias["identityfile"][0], f"IdentityFile of {name!r} in ~/.ssh/config"
    if identity is None:
        identity = next((k for k in _DEFAULT_KEYS if Path(k).expanduser().is_file()), None)
        if identity is None:
            raise SpecError(
                f"{where}: identity_file: none given and none of {', '.join(_DEFAULT_KEYS)} exists; "
                "name the private key that opens the host (identity_file: ~/.ssh/KEY)"
            )
    key_path = Path(identity).expanduser()
    if not key_path.is_file():
        raise SpecError(f"{where}: {field}: {identity!r} does not exist (expanded: {key_path})")
    host_key = fields.get("host_key")
    if host_key is not None:
        parts = host_key.split()
        if len(parts) < 2 or parts[0] not in HOST_KEY_TYPES:
            raise SpecError(
                f"{where}: host_key: must be `<type> <base64>` as in known_hosts ({', '.join(HOST_KEY_TYPES)}), "
                f"got {show(host_key[:60])}; `ssh-keyscan HOST` prints it (check its fingerprint)"
            )
        host_key = f"{parts[0]} {parts[1]}"
    return PoolHost(
        index=index,
        name=name,
        address=address,
        port=port,
        user=str(user),
        identity_file=str(key_path),
        password=fields.get("password") or defaults.get("password"),
        host_key=host_key,
    )


def _ssh_config(path: Path | None) -> paramiko.SSHConfig:
    """The user's OpenSSH client config, parsed by paramiko (empty when there is none)."""
    import paramiko  # here: listing the pools (a cluster search) reads no ssh config

    path = path or user_ssh_config()
    if path.is_file():
        return paramiko.SSHConfig.from_path(str(path))
    return paramiko.SSHConfig()


def is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
