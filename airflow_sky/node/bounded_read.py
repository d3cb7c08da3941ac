"""Bounded reads of node files over SFTP: a job controls its files, so a read stops at a size and a deadline,
and only a regular file is read (a link to /dev/zero or a FIFO would be endless or block)."""

from __future__ import annotations

import io
import stat
import time
from typing import Any

import paramiko

from airflow_sky.errors import RemoteError

# Reads of files a job can touch are bounded in bytes and time (NodeClient.read_file, read_range).
MAX_SMALL_FILE_BYTES = 1024 * 1024  # an exit code, a pid, a lock, a result (callers may ask for less or more)
MAX_RANGE_BYTES = 16 * 1024 * 1024  # one read of a log
READ_DEADLINE_S = 120.0
READ_BLOCK = 256 * 1024


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
