"""An ssh pool defined by an Airflow connection (type `sky_ssh_pool`), so workers need no file on disk.

    host      hosts, comma separated (IPs or aliases), or `hosts` in the extra (the YAML format's list)
    login     the pool's default user           password   accepted (SkyPilot's sudo password), unused
    port      the port for hosts given as IPs (default 22)
    extra     {"hosts": [...], "private_key": "-----BEGIN ...", "identity_file": "~/.ssh/key",
               "known_hosts": "<known_hosts lines pinning the hosts' keys>",
               "state": {"host": "10.0.0.5", "user": "skystate"}}   (the pool file's `state`, required)

`private_key` is a secret (Airflow masks extras of that name); it is written to a 0600 file of this process
for SSH to read, never logged and never passed on a command line.
"""

from __future__ import annotations

import json
from typing import Any

from airflow_sky.errors import SpecError
from airflow_sky.infra.keys import write_key_file
from airflow_sky.infra.ssh.pools import Pool, parse_pool

CONN_TYPE = "sky_ssh_pool"


def load_connection_pool(pool_name: str, conn_id: str) -> Pool:
    """Pool `pool_name` from the Airflow connection `conn_id`."""
    from airflow.sdk import BaseHook  # an Airflow connection only exists where Airflow does

    try:
        conn = BaseHook.get_connection(conn_id)
    except Exception as e:  # Airflow raises its own not-found types, which differ between contexts
        raise SpecError(
            f"conn_id: Airflow connection {conn_id!r} for ssh pool {pool_name!r} not found: {e}"
        ) from e
    extra = _extra(conn.extra, conn_id)
    return pool_from_fields(
        pool_name,
        conn_id,
        host=conn.host,
        login=conn.login,
        password=conn.password,
        port=conn.port,
        extra=extra,
    )


def _extra(raw: Any, conn_id: str) -> dict[str, Any]:
    if not raw:
        return {}
    if isinstance(raw, dict):
        return raw
    try:
        data = json.loads(raw)
    except ValueError as e:
        raise SpecError(f"connection {conn_id!r}: extra is not valid JSON ({e.args[0]})") from e
    if not isinstance(data, dict):
        raise SpecError(f"connection {conn_id!r}: extra must be a JSON object")
    return data


_EXTRA_FIELDS = ("hosts", "private_key", "identity_file", "known_hosts", "state")


def pool_from_fields(
    pool_name: str,
    conn_id: str,
    *,
    host: str | None,
    login: str | None,
    password: str | None,
    port: int | None,
    extra: dict[str, Any],
) -> Pool:
    source = f"Airflow connection {conn_id!r}"
    unknown = sorted(set(extra) - set(_EXTRA_FIELDS))
    if unknown:
        raise SpecError(
            f"{source}: extra: unknown field(s) {', '.join(unknown)} (allowed: {', '.join(_EXTRA_FIELDS)})"
        )
    hosts = extra.get("hosts")
    if hosts is None and host:
        hosts = [h.strip() for h in host.split(",") if h.strip()]
    private_key = extra.get("private_key")
    identity_file = extra.get("identity_file")
    if private_key:
        if not isinstance(private_key, str) or "PRIVATE KEY" not in private_key:
            raise SpecError(f"{source}: extra.private_key: must be an OpenSSH/PEM private key text")
        identity_file = write_key_file(conn_id, private_key)
    raw: dict[str, Any] = {"hosts": hosts}
    for key, value in (("user", login), ("password", password), ("identity_file", identity_file)):
        if value:
            raw[key] = value
    if extra.get("state") is not None:
        raw["state"] = extra["state"]
    pool = parse_pool(pool_name, raw, source, default_port=int(port or 22))
    known = extra.get("known_hosts") or ""
    if not isinstance(known, str):
        raise SpecError(f"{source}: extra.known_hosts: must be known_hosts text (one host key per line)")
    return Pool(
        name=pool.name,
        source=source,
        hosts=pool.hosts,
        private_key=private_key,
        known_hosts=tuple(line for line in known.splitlines() if line.strip()),
        state=pool.state,
        state_field="extra.state",
    )
