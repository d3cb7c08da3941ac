"""What the VM clouds (aws, gcp) share outside the provisioning flow: their settings' common part, where
`infra` pins them, the bounds of their waits, the cluster's own record in its state store, and the SSH key.

The flow itself is provisioner.py; a VM cloud is a VmCloud that also implements provisioner.VmDriver.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable
from typing import Any

from airflow_sky.errors import SpecError
from airflow_sky.infra.base import Cloud, Endpoint, Node
from airflow_sky.infra.provisioning import resolver_from_env, update_record, wait_for_ssh
from airflow_sky.infra.state_store import StateStore

PLACEMENT_KEY = "placement"  # the record of where the cluster lives, beside its job records
SHUTDOWN = "sudo -n shutdown -h now || sudo -n poweroff || shutdown -h now"  # how a node stops itself


@dataclasses.dataclass(frozen=True, kw_only=True)
class VmSettings:
    """The settings every VM cloud reads from its Airflow connection's `airflow_sky` extra."""

    conn_id: str
    ssh_key_file: str
    ssh_user: str
    ssh_cidr: str = "0.0.0.0/0"  # who may reach port 22
    use_private_ip: bool = False  # SSH to private addresses (Airflow inside the network)
    regions: tuple[str, ...] | None = None  # the regions the optimizer may use (None: all)


class VmCloud(Cloud):
    """A cloud that makes machines. `region` and `zone` are what `infra` pins, if anything."""

    region: str | None = None
    zone: str | None = None
    running_timeout_s = 600.0  # each wait is bounded: until running, until SSH answers
    ssh_timeout_s = 600.0
    poll_s = 3.0
    # For emulators only: their machines stand in for the instances (see provisioning.resolver_from_env).
    _resolver: Callable[[str], dict[str, Any]] | None = None

    def _pin(self, location: str, resolver_env: str) -> None:
        """Take `infra: <cloud>/<location>`'s pins, and an emulator's resolver if `resolver_env` names one."""
        self.region, self.zone = parse_location(self.name, location)
        self._resolver = resolver_from_env(resolver_env)

    @property
    @abc.abstractmethod
    def settings(self) -> VmSettings: ...

    @abc.abstractmethod
    def _store(self, cluster_name: str) -> StateStore: ...

    def state_store(self, cluster_name: str) -> StateStore:
        return self._store(cluster_name)

    def ssh_private_key(self, cluster_name: str) -> str:
        return self.settings.ssh_key_file

    def _record(self, cluster_name: str) -> dict[str, Any] | None:
        record = self._store(cluster_name).get(PLACEMENT_KEY)
        return record.data if record else None

    def _update_record(self, cluster_name: str, changes: dict[str, Any], what: str | None = None) -> None:
        """Merge `changes` into the cluster's record (what autostop recorded stays for later nodes)."""
        what = what or f"where cluster {cluster_name!r} lives"
        update_record(self._store(cluster_name), PLACEMENT_KEY, changes, what)

    def _endpoint_of(self, instance_id: str, private_ip: str | None, public_ip: str | None) -> Endpoint:
        """Where SSH reaches the instance: its public address unless the connection says private."""
        if self._resolver is not None:
            return Endpoint.resolved(self._resolver(instance_id))
        s = self.settings
        host = private_ip if s.use_private_ip else (public_ip or private_ip)
        return Endpoint(host or "", 22, s.ssh_user, private_ip or "")

    def autostop_action(self, cluster_name: str, down: bool) -> str:
        # What the shutdown does to the instance (stop it, or end it) is the cloud's: see prepare_autostop.
        return SHUTDOWN

    @staticmethod
    def _refuse_stopping_spot(use_spot: bool, down: bool, machines: str) -> None:
        """Spot machines are ended, never stopped: autostop on them must be autodown."""
        if use_spot and not down:
            raise SpecError(
                f"resources.autostop: spot {machines} cannot be stopped, only ended; set `down: true` "
                "(or add --down to -i)"
            )

    def _wait_ssh(self, nodes: list[Node]) -> None:
        wait_for_ssh(self.name, nodes, self.settings.ssh_key_file, self.ssh_timeout_s, self.poll_s)


def parse_location(cloud: str, location: str) -> tuple[str | None, str | None]:
    """`<region>` or `<region>/<zone>` of `infra: <cloud>/...`: the region and zone it pins, if any."""
    parts = [p for p in (location or "").split("/") if p]
    if len(parts) > 2:
        raise SpecError(
            f"infra: {cloud} takes {cloud}, {cloud}/<region> or {cloud}/<region>/<zone>, got {cloud}/{location}"
        )
    return (parts[0] if parts else None), (parts[1] if len(parts) > 1 else None)
