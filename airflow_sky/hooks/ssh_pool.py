"""SkySshPoolHook: the `sky_ssh_pool` connection type, an ssh node pool kept in Airflow's connections.

With it, Celery or Kubernetes workers need no pool file on disk: `sky_job(..., infra="ssh/<pool>",
conn_id="<conn>")` reads the hosts, the default user, the private key (a secret), the pinned host keys and
the state host (`extra.state`: where the pool's job records live, a host/user no job runs as) from the
connection. The fields are described in airflow_sky.infra.ssh.connection.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook

from airflow_sky.infra.ssh.connection import CONN_TYPE, load_connection_pool
from airflow_sky.infra.ssh.pools import Pool


class SkySshPoolHook(BaseHook):
    """Reads an ssh node pool from an Airflow connection of type `sky_ssh_pool`."""

    conn_name_attr = "conn_id"
    default_conn_name = "sky_ssh_pool_default"
    conn_type = CONN_TYPE
    hook_name = "airflow-sky SSH node pool"

    def __init__(self, conn_id: str = default_conn_name, pool: str | None = None) -> None:
        super().__init__()
        self.conn_id = conn_id
        self.pool_name = pool or conn_id

    def get_conn(self) -> Pool:
        return load_connection_pool(self.pool_name, self.conn_id)

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return {
            "hidden_fields": ["schema"],
            "relabeling": {
                "host": "Hosts (comma separated IPs or ssh-config aliases)",
                "login": "Default user",
                "password": "Password (SkyPilot's sudo password; not used)",
                "port": "SSH port of hosts given as IPs",
            },
            "placeholders": {
                "host": "10.0.0.1, 10.0.0.2",
                "login": "ubuntu",
                "port": "22",
                "extra": '{"private_key": "-----BEGIN OPENSSH PRIVATE KEY-----\\n...", '
                '"known_hosts": "10.0.0.1 ssh-ed25519 AAAA...\\n10.0.0.2 ssh-ed25519 AAAA...", '
                '"state": {"host": "10.0.0.5", "user": "skystate"}}',
            },
        }
