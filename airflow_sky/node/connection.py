"""The SSH connection to one node that every NodeClient of this process shares (node.client uses it)."""

from __future__ import annotations

import contextlib
import random
import threading
import time
from typing import Any

import paramiko

from airflow_sky.errors import RemoteError
from airflow_sky.node.pinned_ssh import HostKeyMismatch, PinnedConnector
from airflow_sky.node.record import Node

SFTP_TIMEOUT_S = 60.0  # the longest a node may take to answer one SFTP request
# Commands running at once over one connection. OpenSSH refuses channels past MaxSessions (default 10, the
# SFTP channel among them): an ssh pool's state host serves every host lock and record of a wide cluster's
# provision over one connection, so its commands wait their turn instead of failing "Connect failed".
# A channel closed a moment ago may still count there until sshd has reaped its session, so the bound
# leaves room, and a refused channel is asked for again until the command's deadline.
MAX_CHANNELS = 6


class SharedConnection:
    """One SSH transport (and its SFTP channel) to one node, shared by every NodeClient of this process.

    Sharing bounds the connections a process holds to one per node whatever its threads do (the CLI's log
    view, a phase watcher and a rank's follower all talk to a node over the same transport), and saves the
    handshake when one task follows another. Counted: the last NodeClient to let go closes it.
    """

    def __init__(self, connector: PinnedConnector, node: Node) -> None:
        self.connector = connector
        self.node = node
        self.users = 0
        self.lock = threading.Lock()
        # One SFTP channel serves every thread; paramiko's SFTP client is not safe for concurrent requests.
        self.sftp_lock = threading.RLock()
        self.client: paramiko.SSHClient | None = None
        self.sftp: paramiko.SFTPClient | None = None
        self.channels = threading.BoundedSemaphore(MAX_CHANNELS)

    def ssh(self) -> paramiko.SSHClient:
        with self.lock:
            transport = self.client.get_transport() if self.client else None
            if self.client is None or transport is None or not transport.is_active():
                try:
                    self.client = self.connector.get_conn()
                except HostKeyMismatch as e:
                    raise RemoteError(str(e)) from e
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

    def open_channel(self, deadline: float) -> paramiko.Channel:
        """A session channel; one the server refuses for now (sshd's MaxSessions: ChannelException) is asked
        for again, with backoff, until `deadline`."""
        pause = 0.05
        while True:
            try:
                return self.ssh().get_transport().open_session(timeout=30)  # type: ignore[union-attr]
            except paramiko.ChannelException as e:
                if time.monotonic() + pause >= deadline:
                    raise RemoteError(
                        f"cannot open a channel to node rank {self.node.rank} ({self.node.ssh_host}): {e}"
                    ) from e
                time.sleep(pause * (0.5 + random.random()))
                pause = min(pause * 2, 2.0)
            except (paramiko.SSHException, OSError) as e:
                raise RemoteError(
                    f"cannot open a channel to node rank {self.node.rank} ({self.node.ssh_host}): {e}"
                ) from e


CONNECTIONS: dict[tuple[Any, ...], SharedConnection] = {}
CONNECTIONS_LOCK = threading.Lock()
