"""One SSH connection to one node, through the SSH provider's SSHHook (paramiko), host key pinned."""

from __future__ import annotations

import base64
import contextlib
import logging
import random
import select
import shlex
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import paramiko
from airflow.providers.ssh.hooks.ssh import SSHHook

from airflow_sky.errors import RemoteError
from airflow_sky.node.record import Node

# paramiko logs every connect and SFTP session at INFO: noise in task logs and the CLI.
logging.getLogger("paramiko").setLevel(logging.WARNING)

_HOST_KEY_TYPES: dict[str, type[paramiko.PKey]] = {
    "ssh-ed25519": paramiko.Ed25519Key,
    "ssh-rsa": paramiko.RSAKey,
    "ecdsa-sha2-nistp256": paramiko.ECDSAKey,
    "ecdsa-sha2-nistp384": paramiko.ECDSAKey,
    "ecdsa-sha2-nistp521": paramiko.ECDSAKey,
}


def parse_host_key(host_key: str) -> paramiko.PKey:
    """`<type> <base64>` as in known_hosts -> a paramiko key (paramiko parses the blob)."""
    parts = host_key.split()
    if len(parts) < 2 or parts[0] not in _HOST_KEY_TYPES:
        raise RemoteError(
            f"unsupported host key {host_key[:40]!r}: expected '<type> <base64>' ({', '.join(_HOST_KEY_TYPES)})"
        )
    return _HOST_KEY_TYPES[parts[0]](data=base64.b64decode(parts[1]))  # type: ignore[arg-type]


SFTP_TIMEOUT_S = 60.0  # the longest a node may take to answer one SFTP request
# Between connection attempts, as the SSH provider's own retry waits: 3 s plus up to 2 s.
_RETRY_WAIT_S = 3.0
_RETRY_JITTER_S = 2.0


class NodeSSHHook(SSHHook):
    """SSHHook for a node whose address, user, key and host key come from the cluster record.

    The host key learned at provision time is pinned (no trust-on-first-use), and TCP_NODELAY is set before
    the SSH handshake: paramiko leaves Nagle on, and the handshake's and every small exec's writes then wait
    on the node's delayed ACKs (~90 ms of a ~100 ms connect to a local node, ~40 ms per small exec).
    """

    def __init__(
        self, node: Node, key_file: str, conn_timeout: int = 10, conn_retry_attempts: int = 3
    ) -> None:
        super().__init__(
            remote_host=node.ssh_host,
            username=node.ssh_user,
            key_file=key_file,
            port=node.ssh_port,
            conn_timeout=conn_timeout,
            keepalive_interval=15,
            conn_retry_attempts=conn_retry_attempts,
        )
        self.look_for_keys = False
        self.compress = False  # rsync compresses what needs it; zlib only slows small execs
        if not node.host_key:
            # Never trust on first use: a node's host key is learned when it is provisioned (the local
            # driver generates it, a cloud driver reads it from the instance's console or metadata).
            raise RemoteError(
                f"node rank {node.rank} ({node.ssh_host}:{node.ssh_port}) has no pinned host key in its "
                "record; airflow-sky learns a node's host key when it provisions the node and refuses "
                "unpinned connections: provision the node again (airflow-sky launch) or add its host key"
            )
        self.host_key = parse_host_key(node.host_key)  # type: ignore[assignment]
        self.no_host_key_check = False
        # The attempts are made here (get_conn), each over a socket of its own; the provider's loop makes one.
        self.connect_attempts, self.conn_retry_attempts = self.conn_retry_attempts, 1

    def get_conn(self) -> paramiko.SSHClient:
        if self.client is not None and (transport := self.client.get_transport()) and transport.is_active():
            return self.client
        if self.host_proxy_cmd:  # the user's ~/.ssh/config sends this host through a ProxyCommand
            self.conn_retry_attempts = self.connect_attempts
            try:
                client = super().get_conn()
            finally:
                self.conn_retry_attempts = 1
        else:
            client = self._connect_nodelay()
        transport = client.get_transport()
        if transport is not None:
            with contextlib.suppress(OSError, AttributeError):  # AttributeError: a ProxyCommand is no socket
                transport.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # type: ignore[union-attr]
        return client

    def _connect_nodelay(self) -> paramiko.SSHClient:
        """The provider's get_conn over a TCP socket made here with TCP_NODELAY from the start (handed over
        as the provider hands a ProxyCommand to paramiko); a fresh socket for each attempt."""
        for attempt in range(1, self.connect_attempts + 1):
            sock: socket.socket | None = None
            try:
                sock = socket.create_connection((self.remote_host, self.port), timeout=self.conn_timeout)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self.__dict__["host_proxy"] = sock  # the provider passes `host_proxy` as paramiko's sock
                client = super().get_conn()
            except Exception as e:
                if sock is not None:
                    sock.close()
                if attempt == self.connect_attempts:
                    raise
                self.log.info("Failed to connect (%s). Sleeping before retry attempt %d", e, attempt + 1)
                time.sleep(_RETRY_WAIT_S + random.uniform(0, _RETRY_JITTER_S))
                continue
            finally:
                self.__dict__.pop("host_proxy", None)
            transport = client.get_transport()
            if transport is None or transport.sock is not sock:
                sock.close()  # a provider that made its own socket: ours was never used
            return client
        raise AssertionError("unreachable: the last attempt returns or raises")


class _Connection:
    """One SSH transport (and its SFTP channel) to one node, shared by every NodeClient of this process.

    Sharing bounds the connections a process holds to one per node whatever its threads do (the CLI's log
    view, a phase watcher and a rank's follower all talk to a node over the same transport), and saves the
    handshake when one task follows another. Counted: the last NodeClient to let go closes it.
    """

    def __init__(self, hook: NodeSSHHook, node: Node) -> None:
        self.hook = hook
        self.node = node
        self.users = 0
        self.lock = threading.Lock()
        # One SFTP channel serves every thread; paramiko's SFTP client is not safe for concurrent requests.
        self.sftp_lock = threading.RLock()
        self.client: paramiko.SSHClient | None = None
        self.sftp: paramiko.SFTPClient | None = None

    def ssh(self) -> paramiko.SSHClient:
        with self.lock:
            transport = self.client.get_transport() if self.client else None
            if self.client is None or transport is None or not transport.is_active():
                try:
                    self.client = self.hook.get_conn()
                except (paramiko.SSHException, OSError, EOFError) as e:  # EOF: the node died mid-handshake
                    raise RemoteError(
                        f"cannot reach node rank {self.node.rank} at {self.node.ssh_host}:{self.node.ssh_port}: {e}"
                    ) from e
                self.sftp = None
            return self.client

    def open_sftp(self) -> paramiko.SFTPClient:
        client = self.ssh()
        with self.lock:
            if self.sftp is None:
                self.sftp = client.open_sftp()
                # Every SFTP request waits at most this long for the node's answer (a hung node fails the
                # operation instead of the task waiting forever).
                self.sftp.get_channel().settimeout(SFTP_TIMEOUT_S)  # type: ignore[union-attr]
            return self.sftp

    def reset(self) -> None:
        """Drop the transport (it broke, or a node stopped answering); the next use opens a new one."""
        with self.lock:
            if self.sftp is not None:
                with contextlib.suppress(Exception):
                    self.sftp.close()
            if self.client is not None:
                with contextlib.suppress(Exception):
                    self.client.close()
            self.sftp = None
            self.client = None


_CONNECTIONS: dict[tuple[Any, ...], _Connection] = {}
_CONNECTIONS_LOCK = threading.Lock()


def open_connections() -> int:
    """How many node connections this process holds open now (for tests and benchmarks)."""
    with _CONNECTIONS_LOCK:
        return sum(1 for c in _CONNECTIONS.values() if c.client is not None)


class NodeClient:
    """Exec, streaming exec and SFTP on one node over this process's shared connection to it. Thread-safe."""

    def __init__(
        self, node: Node, key_file: str, conn_timeout: int = 10, conn_retry_attempts: int = 3
    ) -> None:
        self.node = node
        self.key_file = key_file
        self._hook = NodeSSHHook(node, key_file, conn_timeout, conn_retry_attempts)
        self._key = (node.ssh_host, node.ssh_port, node.ssh_user, node.host_key, node.instance_id, key_file)
        self._held: _Connection | None = None
        self._hold_lock = threading.Lock()
        self.remote_has_rsync: bool | None = None  # learned by the first sync over this client

    def __enter__(self) -> NodeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _connection(self) -> _Connection:
        with self._hold_lock:
            if self._held is None:
                with _CONNECTIONS_LOCK:
                    connection = _CONNECTIONS.get(self._key)
                    if connection is None:
                        connection = _CONNECTIONS[self._key] = _Connection(self._hook, self.node)
                    connection.users += 1
                self._held = connection
            return self._held

    @property
    def ssh(self) -> paramiko.SSHClient:
        return self._connection().ssh()

    @property
    def sftp(self) -> paramiko.SFTPClient:
        return self._connection().open_sftp()

    def reset(self) -> None:
        """Reconnect on the next call (for every user of the shared connection: it is broken or hung)."""
        self._connection().reset()

    def close(self) -> None:
        """Let go of the shared connection; the last user closes it."""
        with self._hold_lock:
            connection, self._held = self._held, None
        if connection is None:
            return
        with _CONNECTIONS_LOCK:
            connection.users -= 1
            last = connection.users <= 0
            if last:
                _CONNECTIONS.pop(self._key, None)
        if last:
            connection.reset()

    def exec(
        self, command: str, stdin: bytes | IO[bytes] | None = None, timeout: float | None = 120
    ) -> tuple[int, bytes, bytes]:
        """Run `command` (bash text, never carrying secrets) and return (exit code, stdout, stderr)."""
        chunks: dict[str, list[bytes]] = {"out": [], "err": []}
        rc = self.exec_stream(
            command,
            on_stdout=chunks["out"].append,
            on_stderr=chunks["err"].append,
            stdin=stdin,
            timeout=timeout,
        )
        return rc, b"".join(chunks["out"]), b"".join(chunks["err"])

    def exec_stream(
        self,
        command: str,
        on_stdout: Callable[[bytes], Any],
        on_stderr: Callable[[bytes], Any] | None = None,
        stdin: bytes | IO[bytes] | None = None,
        timeout: float | None = None,
    ) -> int:
        """Run `command`, handing output chunks to the callbacks as they arrive; return the exit code."""
        try:
            channel = self.ssh.get_transport().open_session(timeout=30)  # type: ignore[union-attr]
        except (paramiko.SSHException, OSError) as e:
            raise RemoteError(
                f"cannot open a channel to node rank {self.node.rank} ({self.node.ssh_host}): {e}"
            ) from e
        with channel:
            channel.settimeout(timeout)
            channel.exec_command(f"bash -c {shlex.quote(command)}")
            if stdin is not None:
                self._send_stdin(channel, stdin)
            channel.shutdown_write()
            try:
                for out, err in _drain(channel):
                    if out:
                        on_stdout(out)
                    if err and on_stderr is not None:
                        on_stderr(err)
            except TimeoutError as e:
                raise RemoteError(f"command on node rank {self.node.rank} timed out after {timeout}s") from e
            return channel.recv_exit_status()

    @staticmethod
    def _send_stdin(channel: paramiko.Channel, stdin: bytes | IO[bytes]) -> None:
        if isinstance(stdin, bytes):
            channel.sendall(stdin)
            return
        while block := stdin.read(256 * 1024):
            channel.sendall(block)

    @contextlib.contextmanager
    def _sftp_call(self, operation: str) -> Iterator[paramiko.SFTPClient]:
        """One SFTP operation: a node that stops answering fails it with a RemoteError naming it."""
        with self._connection().sftp_lock:
            try:
                yield self.sftp
            except TimeoutError as e:
                self.reset()  # the channel is out of step with the server now
                raise RemoteError(
                    f"{operation} on node rank {self.node.rank} ({self.node.ssh_host}): no answer within "
                    f"{SFTP_TIMEOUT_S:.0f}s"
                ) from e
            except (paramiko.SSHException, EOFError) as e:
                self.reset()
                raise RemoteError(
                    f"{operation} on node rank {self.node.rank} ({self.node.ssh_host}): {e}"
                ) from e

    def put(self, local_path: str | Path, remote_path: str, mode: int | None = None) -> None:
        """Upload one file (streamed in blocks); relative remote paths are under the node's home."""
        with self._sftp_call(f"upload of {remote_path}") as sftp:
            sftp.put(str(local_path), remote_path)
            if mode is not None:
                sftp.chmod(remote_path, mode)

    def get(self, remote_path: str, local_path: str | Path) -> None:
        """Download one file (streamed in blocks)."""
        with self._sftp_call(f"download of {remote_path}") as sftp:
            sftp.get(remote_path, str(local_path))

    def read_file(self, remote_path: str, max_bytes: int | None = None) -> bytes | None:
        """A small remote file's content, or None when it does not exist.

        With `max_bytes`, a larger file raises FileTooLarge (its size) rather than being read.
        """
        with self._sftp_call(f"read of {remote_path}") as sftp:
            try:
                with sftp.open(remote_path, "rb") as f:
                    if max_bytes is not None:
                        size = f.stat().st_size or 0
                        if size > max_bytes:
                            raise FileTooLarge(remote_path, size, max_bytes)
                    return f.read()
            except FileNotFoundError:
                return None

    def read_range(self, remote_path: str, offset: int, max_bytes: int) -> tuple[bytes, int] | None:
        """Up to `max_bytes` of a file from `offset`, and the file's size; None when it does not exist.

        SFTP, so the node spawns no process: a log poll costs the node a few requests, not a shell.
        """
        with self._sftp_call(f"read of {remote_path}") as sftp:
            try:
                with sftp.open(remote_path, "rb") as f:
                    size = f.stat().st_size or 0
                    if max_bytes <= 0 or offset >= size:
                        return b"", size
                    f.seek(offset)
                    return f.read(min(max_bytes, size - offset)), size
            except FileNotFoundError:
                return None

    def listdir(self, remote_path: str) -> list[str] | None:
        """The names in a remote directory, or None when it does not exist."""
        with self._sftp_call(f"listing of {remote_path}") as sftp:
            try:
                return sftp.listdir(remote_path)
            except FileNotFoundError:
                return None

    def rename(self, source: str, destination: str) -> None:
        """Atomic rename over an existing file (POSIX rename)."""
        with self._sftp_call(f"rename of {source}") as sftp:
            sftp.posix_rename(source, destination)

    @contextlib.contextmanager
    def open_remote(self, remote_path: str, mode: str = "rb") -> Iterator[paramiko.SFTPFile]:
        with self._sftp_call(f"transfer of {remote_path}") as sftp, sftp.open(remote_path, mode) as f:
            yield f


class FileTooLarge(RemoteError):
    def __init__(self, path: str, size: int, limit: int) -> None:
        super().__init__(f"{path} is {size} bytes, over the limit of {limit}")
        self.path, self.size, self.limit = path, size, limit


def _drain(channel: paramiko.Channel) -> Iterator[tuple[bytes, bytes]]:
    """Yield (stdout, stderr) chunks until the remote side closes both and exits."""
    while True:
        got = False
        if channel.recv_ready():
            got = True
            out = channel.recv(65536)
        else:
            out = b""
        if channel.recv_stderr_ready():
            got = True
            err = channel.recv_stderr(65536)
        else:
            err = b""
        if got:
            yield out, err
            continue
        if channel.exit_status_ready() and not channel.recv_ready() and not channel.recv_stderr_ready():
            # Drain the last bytes that may arrive together with the exit status.
            while channel.recv_ready():
                yield channel.recv(65536), b""
            return
        if channel.closed:
            return
        _wait_readable(channel)


def _wait_readable(channel: paramiko.Channel) -> None:
    timeout = channel.gettimeout()
    readable, _, _ = select.select([channel], [], [], timeout if timeout is not None else 1.0)
    if not readable and timeout is not None and not channel.exit_status_ready():
        raise TimeoutError
