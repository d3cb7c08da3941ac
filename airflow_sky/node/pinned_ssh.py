"""The SSH connect to one node: its host key pinned (no trust on first use), retried while it boots."""

from __future__ import annotations

import base64
import logging
import os
import random
import socket
import time
from typing import Any

import paramiko

from airflow_sky.errors import RemoteError
from airflow_sky.node.record import Node

_log = logging.getLogger(__name__)

_HOST_KEY_TYPES: dict[str, type[paramiko.PKey]] = {
    "ssh-ed25519": paramiko.Ed25519Key,
    "ssh-rsa": paramiko.RSAKey,
    "ecdsa-sha2-nistp256": paramiko.ECDSAKey,
    "ecdsa-sha2-nistp384": paramiko.ECDSAKey,
    "ecdsa-sha2-nistp521": paramiko.ECDSAKey,
}


def _proxy_command(host: str) -> str | None:
    """The ProxyCommand the user's ~/.ssh/config gives `host`, read as the SSH provider reads it; or None."""
    path = os.path.expanduser("~/.ssh/config")
    if not os.path.isfile(path):
        return None
    config = paramiko.SSHConfig()
    with open(path) as f:
        config.parse(f)
    command = config.lookup(host).get("proxycommand")
    return str(command) if command else None


def parse_host_key(host_key: str) -> paramiko.PKey:
    """`<type> <base64>` as in known_hosts -> a paramiko key (paramiko parses the blob)."""
    parts = host_key.split()
    if len(parts) < 2 or parts[0] not in _HOST_KEY_TYPES:
        raise RemoteError(
            f"unsupported host key {host_key[:40]!r}: expected '<type> <base64>' ({', '.join(_HOST_KEY_TYPES)})"
        )
    return _HOST_KEY_TYPES[parts[0]](data=base64.b64decode(parts[1]))  # type: ignore[arg-type]


# Between connection attempts, as the SSH provider's own retry waits: 3 s plus up to 2 s.
_RETRY_WAIT_S = 3.0
_RETRY_JITTER_S = 2.0


class PinnedConnector:
    """Opens SSH connections (paramiko) to one node whose address, user, key and host key come from its record.

    The host key learned at provision time is pinned (no trust-on-first-use), and TCP_NODELAY is set before
    the SSH handshake: paramiko leaves Nagle on, and the handshake's and every small exec's writes then wait
    on the node's delayed ACKs (~90 ms of a ~100 ms connect to a local node, ~40 ms per small exec).

    Plain paramiko, as the SSH provider's SSHHook connects (a ProxyCommand from the user's ~/.ssh/config,
    its banner timeout): this connect was always our own (the hook's reads known_hosts first, see
    _connect_pinned), and subclassing the hook only imported Airflow, seconds of every `airflow-sky queue`
    or `logs`, which never otherwise need it.
    """

    banner_timeout = 30.0  # the SSH provider's defaults
    keepalive_interval = 15

    def __init__(
        self, node: Node, key_file: str, conn_timeout: int = 10, conn_retry_attempts: int = 3
    ) -> None:
        if not node.host_key:
            # Never trust on first use: a node's host key is learned when it is provisioned (the local
            # driver generates it, a cloud driver reads it from the instance's console or metadata).
            raise RemoteError(
                f"node rank {node.rank} ({node.ssh_host}:{node.ssh_port}) has no pinned host key in its "
                "record; airflow-sky learns a node's host key when it provisions the node and refuses "
                "unpinned connections: provision the node again (airflow-sky launch) or add its host key"
            )
        self.node = node
        self.remote_host = node.ssh_host
        self.port = node.ssh_port
        self.username = node.ssh_user
        self.key_file = key_file
        self.conn_timeout = conn_timeout
        self.connect_attempts = max(1, conn_retry_attempts)
        self.host_key = parse_host_key(node.host_key)
        self.host_proxy_cmd = _proxy_command(node.ssh_host)

    def get_conn(self) -> paramiko.SSHClient:
        """A new connection, after up to `conn_retry_attempts` attempts (a node may still be booting)."""
        for attempt in range(1, self.connect_attempts + 1):
            try:
                return self._connect_pinned()
            except HostKeyMismatch:
                raise  # another machine answers at this address: trying again changes nothing
            except Exception as e:
                if attempt == self.connect_attempts:
                    raise
                _log.info("Failed to connect (%s). Sleeping before retry attempt %d", e, attempt + 1)
                time.sleep(_RETRY_WAIT_S + random.uniform(0, _RETRY_JITTER_S))
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _connect_pinned(self) -> paramiko.SSHClient:
        """One connection that trusts the node's pinned host key and nothing else.

        No known_hosts file is read (the SSH provider's hook loads ~/.ssh/known_hosts first, where a stale
        line for a recycled cloud IP or a reused loopback address would fail a node whose key is exactly the
        pinned one): the pinned key is the only entry, and any other key is rejected (RejectPolicy).

        TCP_NODELAY is set before the handshake (over our own socket); a ProxyCommand from the user's
        ~/.ssh/config gets a fresh process per attempt.
        """
        client = paramiko.SSHClient()
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        pinned = self.host_key
        client.get_host_keys().add(self.known_hosts_name, pinned.get_name(), pinned)
        sock: Any
        if self.host_proxy_cmd:
            sock = paramiko.ProxyCommand(self.host_proxy_cmd)
        else:
            sock = socket.create_connection((self.remote_host, self.port), timeout=self.conn_timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            client.connect(
                hostname=self.remote_host,
                port=int(self.port or 22),
                username=self.username,
                key_filename=self.key_file,
                timeout=self.conn_timeout,
                compress=False,  # rsync compresses what needs it; zlib only slows small execs
                sock=sock,
                look_for_keys=False,
                banner_timeout=self.banner_timeout,
            )
        except paramiko.BadHostKeyException as e:
            client.close()
            sock.close()
            raise HostKeyMismatch(self.node, e.key) from e
        except BaseException:
            client.close()
            sock.close()
            raise
        client.get_transport().set_keepalive(self.keepalive_interval)  # type: ignore[union-attr]
        return client

    @property
    def known_hosts_name(self) -> str:
        """The name paramiko checks the host key under (`[host]:port` off port 22, as OpenSSH)."""
        return self.remote_host if self.port == 22 else f"[{self.remote_host}]:{self.port}"


class HostKeyMismatch(paramiko.SSHException):
    """The node answered with a host key other than the one pinned in its record."""

    def __init__(self, node: Node, presented: paramiko.PKey) -> None:
        super().__init__(host_key_mismatch_message(node, f"{presented.get_name()} {presented.fingerprint}"))


def host_key_mismatch_message(node: Node, presented: str = "another key") -> str:
    """One line for every transport (paramiko, SFTP, rsync's ssh): the node is refused, and why."""
    pinned = parse_host_key(node.host_key) if node.host_key else None
    expected = f"{pinned.get_name()} {pinned.fingerprint}" if pinned else "none"
    return (
        f"refusing node rank {node.rank} at {node.ssh_host}:{node.ssh_port}: it presented host key "
        f"{presented}, not the key pinned in its record ({expected}). airflow-sky trusts only the pinned key "
        "(never ~/.ssh/known_hosts); another machine may now hold this address: check it, or provision the "
        "node again"
    )
