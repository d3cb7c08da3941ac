"""Bounded reads from a node: of its files over SFTP (a job controls its files, so a read stops at a size and a
deadline, and only a regular file is read: a link to /dev/zero or a FIFO would be endless or block), and of
a command's output (NodeClient.exec keeps at most a cap per stream, and stops at a deadline)."""

from __future__ import annotations

import io
import select
import stat
import time
from collections.abc import Iterator
from typing import Any

import paramiko

from airflow_sky.errors import RemoteError

# Reads of files a job can touch are bounded in bytes and time (NodeClient.read_file, read_range).
MAX_SMALL_FILE_BYTES = 1024 * 1024  # an exit code, a pid, a lock, a result (callers may ask for less or more)
MAX_RANGE_BYTES = 16 * 1024 * 1024  # one read of a log
READ_DEADLINE_S = 120.0
READ_BLOCK = 256 * 1024

# A command's output kept in memory by NodeClient.exec, per stream (the commands airflow-sky runs print a
# line or two; a poll of a log prints at most 1 MiB of it). Past it the command is stopped: a job's files
# or a hostile node must not fill the worker's memory.
MAX_EXEC_OUTPUT_BYTES = 8 * 1024 * 1024
EXEC_TIMEOUT_S = 120.0  # a command's whole run, when its caller names no other
TAIL_BYTES = 2048  # the end of the output an error message shows


class FileTooLarge(RemoteError):
    def __init__(self, path: str, size: int, limit: int) -> None:
        super().__init__(f"{path} is {size} bytes, over the limit of {limit}")
        self.path, self.size, self.limit = path, size, limit


class UnsafeRemoteFile(RemoteError):
    """A file airflow-sky reads from a node is not a regular file (a job may link it to /dev/zero)."""

    def __init__(self, path: str, kind: str, rank: int) -> None:
        super().__init__(
            f"~/{path} on node rank {rank} is {kind}, not a regular file: airflow-sky does not read it "
            "(a read there could be endless or block: a link to /dev/zero, a FIFO)"
        )
        self.path, self.kind = path, kind


def file_kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISLNK, "a symlink"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return f"of mode {mode:o}"


def read_bounded(f: paramiko.SFTPFile, limit: int, path: str) -> bytes:
    """At most `limit` bytes of `f`, in blocks, within READ_DEADLINE_S (each request has the SFTP timeout)."""
    deadline = time.monotonic() + READ_DEADLINE_S
    chunks: list[bytes] = []
    left = limit
    while left > 0:
        if time.monotonic() > deadline:
            raise RemoteError(f"read of ~/{path}: not done within {READ_DEADLINE_S:.0f}s")
        block = f.read(min(left, READ_BLOCK))
        if not block:
            break
        chunks.append(block)
        left -= len(block)
    return b"".join(chunks)


class Bounded(io.RawIOBase):
    """A readable view of `f` that ends after `size` bytes."""

    def __init__(self, f: paramiko.SFTPFile, size: int) -> None:
        self._f, self._left = f, size

    def readable(self) -> bool:
        return True

    def prefetch(self) -> None:
        self._f.prefetch(self._left)

    def read(self, n: int = -1) -> bytes:
        want = self._left if n is None or n < 0 else min(n, self._left)
        if want <= 0:
            return b""
        block = self._f.read(want)
        self._left -= len(block)
        return block

    def readinto(self, buffer: Any) -> int:
        block = self.read(len(buffer))
        buffer[: len(block)] = block
        return len(block)


class OutputTooLarge(RemoteError):
    """A command printed more than its cap on one stream; it was stopped. Its message carries the tail."""

    def __init__(self, what: str, stream: str, limit: int, tail: bytes) -> None:
        shown = tail.decode(errors="replace").strip()[-TAIL_BYTES:]
        super().__init__(
            f"{what}: printed more than {limit} bytes on {stream}, the limit of what is read back; it was "
            f"stopped (a command that prints this much should write a file and read it in ranges)"
            + (f"; its output ended with: ...{shown}" if shown else "")
        )
        self.stream, self.limit = stream, limit


class Capped:
    """A stream's output, up to `limit` bytes; `full` once more arrived (the last bytes are kept for errors)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.chunks: list[bytes] = []
        self.size = 0
        self.full = False

    def add(self, data: bytes) -> None:
        if self.full or not data:
            return
        self.size += len(data)
        self.chunks.append(data)
        if self.size > self.limit:
            self.full = True
            self.chunks = [self.value()[-TAIL_BYTES:]]  # only the tail stays: for the error message

    def value(self) -> bytes:
        return b"".join(self.chunks)


def drain(channel: paramiko.Channel, deadline: float) -> Iterator[tuple[bytes, bytes]]:
    """Yield (stdout, stderr) chunks until the remote side closes both and exits; TimeoutError at `deadline`
    (time.monotonic) whether or not the command prints meanwhile."""
    while True:
        out = channel.recv(65536) if channel.recv_ready() else b""
        err = channel.recv_stderr(65536) if channel.recv_stderr_ready() else b""
        if out or err:
            yield out, err
            if time.monotonic() > deadline:
                raise TimeoutError
            continue
        if channel.exit_status_ready() and not channel.recv_ready() and not channel.recv_stderr_ready():
            # Drain the last bytes that may arrive together with the exit status.
            while channel.recv_ready():
                yield channel.recv(65536), b""
            return
        if channel.closed:
            return
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        select.select([channel], [], [], min(left, 1.0))
