"""Exec, streaming exec and SFTP on one node over one shared SSH connection (paramiko); the connect is
node.pinned_ssh, the limits of reads node.bounded_read."""

from __future__ import annotations

import contextlib
import logging
import shlex
import shutil
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import paramiko

from airflow_sky.errors import RemoteError
from airflow_sky.node import connection as node_connection
from airflow_sky.node.bounded_read import (
    EXEC_TIMEOUT_S,
    MAX_EXEC_OUTPUT_BYTES,
    MAX_RANGE_BYTES,
    MAX_SMALL_FILE_BYTES,
    READ_BLOCK,
    Bounded,
    Capped,
    FileTooLarge,
    OutputTooLarge,
    UnsafeRemoteFile,
    drain,
    file_kind,
    read_bounded,
)
from airflow_sky.node.connection import (
    CONNECTIONS,
    CONNECTIONS_LOCK,
    MAX_CHANNELS,
    SharedConnection,
)
from airflow_sky.node.pinned_ssh import PinnedConnector, host_key_mismatch_message
from airflow_sky.node.record import Node

# paramiko logs every connect and SFTP session at INFO: noise in task logs and the CLI.
logging.getLogger("paramiko").setLevel(logging.WARNING)

__all__ = [  # what callers import from here: the client, and the errors and limits of its reads
    "MAX_EXEC_OUTPUT_BYTES",
    "MAX_SMALL_FILE_BYTES",
    "FileTooLarge",
    "NodeClient",
    "OutputTooLarge",
    "UnsafeRemoteFile",
    "host_key_mismatch_message",
]


class NodeClient:
    """Exec, streaming exec and SFTP on one node over this process's shared connection to it. Thread-safe."""

    def __init__(
        self, node: Node, key_file: str, conn_timeout: int = 10, conn_retry_attempts: int = 3
    ) -> None:
        self.node = node
        self.key_file = key_file
        self._connector = PinnedConnector(node, key_file, conn_timeout, conn_retry_attempts)
        self._key = (node.ssh_host, node.ssh_port, node.ssh_user, node.host_key, node.instance_id, key_file)
        self._held: SharedConnection | None = None
        self._hold_lock = threading.Lock()
        self.remote_has_rsync: bool | None = None  # learned by the first sync over this client

    def __enter__(self) -> NodeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _connection(self) -> SharedConnection:
        with self._hold_lock:
            if self._held is None:
                with CONNECTIONS_LOCK:
                    connection = CONNECTIONS.get(self._key)
                    if connection is None:
                        connection = CONNECTIONS[self._key] = SharedConnection(self._connector, self.node)
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
        with CONNECTIONS_LOCK:
            connection.users -= 1
            last = connection.users <= 0
            if last:
                CONNECTIONS.pop(self._key, None)
        if last:
            connection.reset()

    def exec(
        self,
        command: str,
        stdin: bytes | IO[bytes] | None = None,
        timeout: float = EXEC_TIMEOUT_S,
        max_bytes: int = MAX_EXEC_OUTPUT_BYTES,
        purpose: str = "a command",
    ) -> tuple[int, bytes, bytes]:
        """Run `command` (bash text, never carrying secrets) and return (exit code, stdout, stderr).

        Bounded: a command still running after `timeout` seconds (its whole run, printing or not), or
        printing more than `max_bytes` on stdout or stderr, is stopped (its channel closed: the node hangs
        up its process group, a writer gets SIGPIPE) and raises RemoteError (OutputTooLarge for the
        output), which names `purpose`, the limit and the output's tail, never the command text (it may
        carry env values). A command meant to print more streams with exec_stream.
        """
        out, err = Capped(max_bytes), Capped(max_bytes)
        what = f"{purpose} on node rank {self.node.rank} ({self.node.ssh_host})"

        def check(capped: Capped, stream: str) -> None:
            if capped.full:
                raise OutputTooLarge(what, stream, max_bytes, capped.value())

        def on_stdout(data: bytes) -> None:
            out.add(data)
            check(out, "stdout")

        def on_stderr(data: bytes) -> None:
            err.add(data)
            check(err, "stderr")

        rc = self.exec_stream(
            command, on_stdout=on_stdout, on_stderr=on_stderr, stdin=stdin, timeout=timeout, purpose=purpose
        )
        return rc, out.value(), err.value()

    def exec_stream(
        self,
        command: str,
        on_stdout: Callable[[bytes], Any],
        on_stderr: Callable[[bytes], Any] | None = None,
        stdin: bytes | IO[bytes] | None = None,
        timeout: float = EXEC_TIMEOUT_S,
        purpose: str = "a command",
    ) -> int:
        """Run `command`, handing output chunks to the callbacks as they arrive; return the exit code.

        The command is stopped (its channel closed) after `timeout` seconds in all, or when a callback
        raises (the exception propagates): the way a caller bounds what it reads.
        """
        deadline = time.monotonic() + timeout
        channels = self._connection().channels
        if not channels.acquire(timeout=timeout):
            raise RemoteError(
                f"{purpose} on node rank {self.node.rank} ({self.node.ssh_host}) did not start within "
                f"{timeout:g}s: {MAX_CHANNELS} other commands held the connection"
            )
        try:
            return self._run_channel(command, on_stdout, on_stderr, stdin, timeout, purpose, deadline)
        finally:
            channels.release()

    def _run_channel(
        self,
        command: str,
        on_stdout: Callable[[bytes], Any],
        on_stderr: Callable[[bytes], Any] | None,
        stdin: bytes | IO[bytes] | None,
        timeout: float,
        purpose: str,
        deadline: float,
    ) -> int:
        channel = self._connection().open_channel(deadline)
        with contextlib.ExitStack() as closing:
            # Leaving closes the channel, which ends a command stopped early. A close on a transport that
            # died meanwhile has nothing left to do: its EOFError must not replace the error being raised
            # (a command stopped for printing too much once failed with a bare EOFError under load).
            closing.callback(_close_quietly, channel)
            channel.settimeout(timeout)
            channel.exec_command(f"bash -c {shlex.quote(command)}")
            if stdin is not None:
                self._send_stdin(channel, stdin)
            channel.shutdown_write()
            try:
                for out, err in drain(channel, deadline):
                    if out:
                        on_stdout(out)
                    if err and on_stderr is not None:
                        on_stderr(err)
            except TimeoutError as e:
                raise RemoteError(
                    f"{purpose} on node rank {self.node.rank} ({self.node.ssh_host}) did not end within "
                    f"{timeout:g}s, its time limit; it was stopped"
                ) from e
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
                    f"{node_connection.SFTP_TIMEOUT_S:.0f}s"
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
        """Download one regular file (streamed in blocks, up to the size it had when opened)."""
        with self.open_regular(remote_path) as (stream, _size), open(local_path, "wb") as out:
            stream.prefetch()
            shutil.copyfileobj(stream, out, READ_BLOCK)

    def read_file(self, remote_path: str, max_bytes: int = MAX_SMALL_FILE_BYTES) -> bytes | None:
        """A small remote file's content, or None when it does not exist.

        Bounded whatever the node holds there (a job controls its files): a symlink, FIFO, device or
        directory is refused (UnsafeRemoteFile) before it is opened, and at most `max_bytes` are read, by a
        deadline; a larger file raises FileTooLarge.
        """
        with self._sftp_call(f"read of {remote_path}") as sftp:
            size = self._regular_size(sftp, remote_path)
            if size is None:
                return None
            if size > max_bytes:
                raise FileTooLarge(remote_path, size, max_bytes)
            try:
                with sftp.open(remote_path, "rb") as f:
                    # The size of the file opened (fstat), not the lstat's: a record replaced by rename in
                    # between (a state store's write) is read whole. One request; growth meanwhile is cut.
                    size = self._opened_size(f, remote_path)
                    if size > max_bytes:
                        raise FileTooLarge(remote_path, size, max_bytes)
                    return read_bounded(f, size, remote_path)
            except FileNotFoundError:
                return None

    def read_range(self, remote_path: str, offset: int, max_bytes: int) -> tuple[bytes, int] | None:
        """Up to `max_bytes` (at most MAX_RANGE_BYTES) of a regular file from `offset`, and the file's size;
        None when it does not exist. A symlink, FIFO, device or directory raises UnsafeRemoteFile.

        SFTP, so the node spawns no process: a log poll costs the node a few requests, not a shell.
        """
        with self._sftp_call(f"read of {remote_path}") as sftp:
            size = self._regular_size(sftp, remote_path)
            if size is None:
                return None
            want = min(max_bytes, MAX_RANGE_BYTES, size - offset)
            if want <= 0:
                return b"", size
            try:
                with sftp.open(remote_path, "rb") as f:
                    size = self._opened_size(f, remote_path)  # the file opened, should it be replaced
                    want = min(max_bytes, MAX_RANGE_BYTES, size - offset)
                    if want <= 0:
                        return b"", size
                    f.seek(offset)
                    return read_bounded(f, want, remote_path), size
            except FileNotFoundError:
                return None

    def _opened_size(self, f: paramiko.SFTPFile, remote_path: str) -> int:
        """The size of the file `f` has open (fstat); it must be a regular file too."""
        attrs = f.stat()
        mode = attrs.st_mode or 0
        if not stat.S_ISREG(mode):
            raise UnsafeRemoteFile(remote_path, file_kind(mode), self.node.rank)
        return attrs.st_size or 0

    def _regular_size(self, sftp: paramiko.SFTPClient, remote_path: str) -> int | None:
        """The size of a regular file at `remote_path` (lstat: a symlink is not followed), None if absent."""
        try:
            attrs = sftp.lstat(remote_path)
        except FileNotFoundError:
            return None
        mode = attrs.st_mode or 0
        if not stat.S_ISREG(mode):
            raise UnsafeRemoteFile(remote_path, file_kind(mode), self.node.rank)
        return attrs.st_size or 0

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
    def open_regular(self, remote_path: str) -> Iterator[tuple[Bounded, int]]:
        """A regular file for reading (a symlink to one is followed: users name artifacts through links),
        and a reader that stops at the size it had when opened: a device, FIFO or directory raises
        UnsafeRemoteFile, and a file that keeps growing is read no further than that size."""
        with self._sftp_call(f"transfer of {remote_path}") as sftp:
            attrs = sftp.stat(remote_path)
            mode = attrs.st_mode or 0
            if not stat.S_ISREG(mode):  # checked before the open: opening a FIFO blocks the SFTP server
                raise UnsafeRemoteFile(remote_path, file_kind(mode), self.node.rank)
            with sftp.open(remote_path, "rb") as f:
                opened = f.stat()
                if not stat.S_ISREG(opened.st_mode or 0):  # swapped between the stat and the open
                    raise UnsafeRemoteFile(remote_path, "no longer a regular file", self.node.rank)
                size = opened.st_size or 0
                yield Bounded(f, size), size


def _close_quietly(channel: paramiko.Channel) -> None:
    with contextlib.suppress(EOFError, OSError, paramiko.SSHException):
        channel.close()
